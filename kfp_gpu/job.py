"""JobTemplate: what the PyTorchJob runs. Travels from the DSL to the train step as JSON.

Kept free of kfp imports: the train step (and the KFP executor that runs it) must not import kfp.dsl
through this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kfp_gpu.errors import InvalidSpec

DEFAULT_TRAINER_IMAGE = "ghcr.io/kfp-gpu/trainer:0.1.0"


@dataclass(frozen=True)
class JobTemplate:
    """What the PyTorchJob runs. Travels to the train step as JSON."""

    name: str = "train"
    image: str = DEFAULT_TRAINER_IMAGE
    command: tuple[str, ...] = ("python", "-m", "pipelines.trainer.train_lm")
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    checkpoint_every: int = 10
    sim_duration_s: float = 2.0  # local rehearsal only: how long KWOK keeps the pods Running

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise InvalidSpec("train.name", self.name, "must be a lowercase DNS label like 'finetune'")
        if not self.command:
            raise InvalidSpec("train.command", self.command, "must not be empty")
        if self.checkpoint_every < 1:
            raise InvalidSpec("train.checkpoint_every", self.checkpoint_every, "must be >= 1 step")
        if self.sim_duration_s < 0:
            raise InvalidSpec("train.sim_duration_s", self.sim_duration_s, "must be >= 0 seconds")

    def to_json(self) -> str:
        return json.dumps({
            "name": self.name, "image": self.image, "command": list(self.command), "args": list(self.args),
            "env": dict(self.env), "checkpoint_every": self.checkpoint_every,
            "sim_duration_s": self.sim_duration_s,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobTemplate:
        """Raises: InvalidSpec when ``text`` is not a job template."""
        try:
            d = json.loads(text)
            return cls(
                name=d["name"], image=d["image"], command=tuple(d["command"]), args=tuple(d.get("args", ())),
                env=tuple(sorted(dict(d.get("env", {})).items())), checkpoint_every=int(d["checkpoint_every"]),
                sim_duration_s=float(d.get("sim_duration_s", 2.0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidSpec("job_json", (text or "")[:80], f"is not a kfp-gpu job template ({exc})") from None
