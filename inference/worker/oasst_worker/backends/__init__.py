"""Backend adapters (TGI, OpenAI-compatible, the sentence encoder), one protocol per kind; imports oasst_shared and settings."""
