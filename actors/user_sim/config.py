"""``UserSimConfig``: the one typed config of the user-simulator role (YAML key ``user_sim``).

Used only when the pool has conversational tasks (``envs.spec.UserSpec``): ``kind`` ``openai``
calls ``endpoint``, ``scripted`` answers from ``scripts``. How many simulator actors run is
``cluster.user_sim``.

Decisions where tau-bench is silent or differs: ``temperature`` 0 (tau-bench's default) with a
per-request ``seed`` from ``seed`` and the episode's seed, so a re-issued group asks the same
questions of a deterministic server; the API key is read from the environment variable
``api_key_env`` on the simulator's node, never written into a config.

May import: pydantic and the standard library only.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class UserSimConfig(BaseModel):
    """The simulated user of conversational tasks; YAML key ``user_sim``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai", "scripted"] = Field(
        "openai", description="openai: call endpoint; scripted: answer from scripts (tests)")
    endpoint: Optional[str] = Field(None, description="OpenAI-compatible base URL, e.g. "
                                    "http://HOST:8000/v1 (kind openai)")
    model: str = Field("default", description="model name sent with each request")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the "
                             "API key on the simulator's node (unset: no key sent)")
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: int = Field(256, ge=1, description="tokens per user message")
    seed: int = Field(0, description="base of the per-request seeds")
    timeout_s: float = Field(60.0, gt=0, description="one HTTP request")
    retries: int = Field(3, ge=0, description="re-sends of a request the endpoint failed "
                         "transiently (unreachable, timeout, HTTP 429/5xx)")
    backoff_s: float = Field(1.0, ge=0, description="first wait before a re-send; doubles each "
                             "time")
    max_backoff_s: float = Field(30.0, ge=0, description="longest wait between re-sends")
    max_concurrency: int = Field(32, ge=1, description="requests in flight per simulator actor")
    scripts: dict[str, list[str]] = Field(
        default_factory=dict, description="kind scripted: task id -> the user's lines in order "
        "(the stop marker after the last)")

    @model_validator(mode="after")
    def _kind_has_its_source(self) -> "UserSimConfig":
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"user_sim.endpoint must be an http(s) URL, got {self.endpoint!r}; "
                             "fix: e.g. http://localhost:8000/v1")
        return self
