"""The ``ray`` block of a cluster description, validated with pydantic.

A Ray description has a ``ray`` block where an SSH/local one has ``cluster``::

    {"ray": {"address": "auto", "workers": 2, "chief": true, "evaluator": true,
             "resources_per_task": {"CPU": 1, "GPU": 0}, "placement": "STRICT_SPREAD"},
     "storage": {"path": "/mnt/shared/tfl"}, "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}

Ray places the tasks (one placement-group bundle each), so there are no ``hosts``, ``ssh``
or ``devices`` keys. Values are taken as written; every error is one line naming the field
and the fix.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from launcher.describe.fields import EnvName, EnvValue, describe_error, one_line
from launcher.describe.spec import StorageSettings
from launcher.engines.ray.address import address_problem
from launcher.errors import ClusterFileError

PLACEMENTS = ("STRICT_SPREAD", "SPREAD", "PACK")
_RESOURCE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RaySettings(_Strict):
    """Where the Ray cluster is, and what the run asks of it: one bundle per task."""

    address: str = Field("auto", description="the cluster: \"auto\", \"ray://host:port\" (Ray Client) or \"host:port\" (GCS)")
    workers: int = Field(0, description="training tasks besides the chief (or all of them with chief: false)")
    chief: bool = Field(True, description="a chief task (task 0 of the training group)")
    evaluator: bool = Field(False, description="also run a sidecar evaluator (a bundle of its own)")
    resources_per_task: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0},
                                                 description="Ray resources of each task's bundle (e.g. {\"CPU\": 4, \"GPU\": 1})")
    placement: Literal["STRICT_SPREAD", "SPREAD", "PACK"] = Field(
        "STRICT_SPREAD", description="placement-group strategy: STRICT_SPREAD (one node per task), SPREAD or PACK")
    ready_timeout: float = Field(60.0, gt=0, le=86400, allow_inf_nan=False,
                                 description="seconds to wait for the placement group (an infeasible one is refused after it)")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        problem = address_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 4096:
            raise ValueError(f"{value!r} is not a count of workers from 0 to 4096 (write e.g. 2)")
        return value

    @field_validator("placement", mode="before")
    @classmethod
    def _placement(cls, value: object) -> object:
        if value not in PLACEMENTS:
            raise ValueError(f"{value!r} is not a placement; write one of {', '.join(PLACEMENTS)}")
        return value

    @field_validator("resources_per_task", mode="before")
    @classmethod
    def _resources(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value  # pydantic says what was expected
        for name, amount in value.items():
            if not isinstance(name, str) or not _RESOURCE.fullmatch(name):
                raise ValueError(f"{name!r} is not a Ray resource name (e.g. \"CPU\", \"GPU\", \"memory\")")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0 or amount != amount:
                raise ValueError(f"{name}: {amount!r} is not an amount (write a number >= 0, e.g. 1 or 0.5)")
        if not any(v > 0 for v in value.values()):
            raise ValueError("asks for nothing; give each task at least one resource, e.g. {\"CPU\": 1}")
        return {k: float(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _training(self) -> RaySettings:
        if self.training_tasks < 1:
            raise ValueError("workers: a run needs at least one training task; set \"workers\": 1 or more, or \"chief\": true")
        return self

    @property
    def training_tasks(self) -> int:
        return int(self.chief) + self.workers

    @property
    def bundle(self) -> dict[str, float]:
        """One task's bundle, without the zero amounts (Ray refuses a bundle of zeros)."""
        return {k: v for k, v in self.resources_per_task.items() if v > 0}


class RayClusterSpec(_Strict):
    """A cluster description whose tasks Ray places."""

    kind: ClassVar[str] = "ray"  # its description kind (launcher.describe.kinds)
    ray: RaySettings
    storage: StorageSettings | None = Field(None, description="storage every node mounts at the same path: the runs' model dirs")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="extra environment for every task")

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in env if k == "TF_CONFIG" or k.startswith("TFL_"))
        if reserved:
            raise ValueError(f"sets {reserved[0]}, which tfl sets for each task; remove it")
        return env

    @model_validator(mode="before")
    @classmethod
    def _not_both(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("cluster", "slurm", "hosts", "ssh", "devices"):
                if key in data:
                    raise ValueError(f"'{key}' cannot be used with 'ray' (Ray places the tasks); remove '{key}'")
        return data


def parse_ray_cluster(data: Any, name: str = "cluster") -> RayClusterSpec:
    """Parsed JSON -> RayClusterSpec, or ClusterFileError naming ``name``, the field and the fix."""
    if not isinstance(data, dict):
        raise ClusterFileError(f"{name}: the file must hold a JSON object with a 'ray' key")
    try:
        return RayClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise ClusterFileError(one_line(f"{name}: {describe_error(exc, RayClusterSpec)}")) from None
