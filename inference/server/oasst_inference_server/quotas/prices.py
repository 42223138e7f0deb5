"""What tokens cost: each model config's optional prices (US dollars per million prompt and completion
tokens), from the server's model registry. Money is counted in whole micro-dollars."""

from __future__ import annotations

from collections.abc import Mapping

from oasst_shared.model_configs import ModelConfig

MICRO = 1_000_000


class Prices:
    def __init__(self, configs: Mapping[str, ModelConfig]) -> None:
        self._prices = {
            name: (c.price_per_million_prompt_tokens or 0.0, c.price_per_million_completion_tokens or 0.0)
            for name, c in configs.items()
        }

    def micro_usd(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> int:
        """The price of the tokens in micro-dollars (a dollar per million tokens is a micro-dollar each);
        0 for a model without prices."""
        prompt, completion = self._prices.get(model or "", (0.0, 0.0))
        return round(prompt_tokens * prompt + completion_tokens * completion)

    def usd(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> float:
        return self.micro_usd(model, prompt_tokens, completion_tokens) / MICRO
