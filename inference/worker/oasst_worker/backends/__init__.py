"""Backend adapters (TGI, OpenAI-compatible, the sentence encoder); may import oasst_shared and settings only."""
