"""The kinds of cluster description, told apart in one place, each with its own planner.

A description file holds one block that says what places its tasks: ``cluster`` (hosts and
ports per task: local processes or SSH), ``slurm`` (Slurm places them), and each engine
added later its own. ``KINDS`` lists them; everything else asks this module:

- ``load_description`` reads a file strictly and hands the data to its kind's parser;
- ``build_plan`` hands a parsed description to its kind's planner (``launcher.plan.build`` itself
  names no engine);
- a plan's engine-specific part (``LaunchPlan.unit``, e.g. Slurm's batch script) is read
  back by ``load_unit`` and shown by ``render_unit``, through the kind named in it.

Every reference is a ``"module:attribute"`` string imported only when that kind is used,
as the backend registry does: a cluster file never loads Slurm's pydantic models, and this
module imports nothing of the stages it dispatches to (no import cycle through here).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import ClusterFileError


@dataclass(frozen=True)
class DescriptionKind:
    """One kind of description: the block that marks it and where its parts live."""

    name: str  # the top-level block that marks the kind ("cluster", "slurm", ...); also ``spec.kind``
    parse: str  # (data, file name) -> the validated description, or ClusterFileError
    planner: str  # (description, job, job_args, **plan options) -> LaunchPlan
    describe: str  # (description, runs dir, python, cwd) -> (lines, task count): `tfl validate`
    unit: str | None = None  # the class of the plan's engine part (``from_dict``); None: plans have none
    render: str | None = None  # (plan) -> the --dry-run text of such a plan; None: the generic text


CLUSTER = DescriptionKind(
    "cluster", parse="launcher.describe.spec:parse_cluster", planner="launcher.plan.cluster_planner:build_cluster_plan",
    describe="launcher.plan.cluster_planner:describe_cluster")
SLURM = DescriptionKind(
    "slurm", parse="launcher.engines.slurm.settings:parse_slurm_cluster", planner="launcher.engines.slurm.plan:build_slurm_plan",
    describe="launcher.engines.slurm.plan:describe_slurm", unit="launcher.engines.slurm.node.batch:SlurmJobPlan",
    render="launcher.engines.slurm.plan:render_slurm_plan")
RAY = DescriptionKind(
    "ray", parse="launcher.engines.ray.settings:parse_ray_cluster", planner="launcher.engines.ray.plan:build_ray_plan",
    describe="launcher.engines.ray.plan:describe_ray", unit="launcher.engines.ray.plan:RayUnit",
    render="launcher.engines.ray.plan:render_ray_plan")
# The engines' blocks first: a file is of the first kind whose block it holds, else a cluster
# file (whose parser names what is missing). A file with two blocks is refused by the parser
# of the first (every description model forbids unknown keys).
KINDS: tuple[DescriptionKind, ...] = (SLURM, RAY, CLUSTER)


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def kind(name: str) -> DescriptionKind:
    for k in KINDS:
        if k.name == name:
            return k
    raise ClusterFileError(f"a description or plan of kind '{name}' is not known to this tfl "
                           f"(known: {', '.join(k.name for k in KINDS)}); use the tfl that wrote it")


def kind_of(data: Any) -> DescriptionKind:
    """The kind of parsed JSON: the first engine whose block it holds, else a ``cluster`` file."""
    if isinstance(data, dict):
        for k in KINDS:
            if k is not CLUSTER and k.name in data:
                return k
    return CLUSTER


def parse_description(data: Any, name: str = "cluster") -> Any:
    """Parsed JSON -> the validated description of its kind (ClusterFileError naming the field)."""
    return _load(kind_of(data).parse)(data, name)


def load_description(path: Path) -> Any:
    """A description file, read strictly (``fields.decode_json``) and validated by its kind."""
    from launcher.describe.fields import decode_json, one_line  # pydantic's: reading a recorded plan needs neither

    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ClusterFileError(one_line(f"{name}: no such file (pass a cluster description, "
                                        "e.g. --cluster cluster.example.json, or use --local N)")) from None
    except OSError as exc:
        raise ClusterFileError(one_line(f"{name}: cannot be read: {exc.strerror}")) from None
    try:
        parsed = decode_json(data)
    except ValueError as exc:
        raise ClusterFileError(one_line(f"{name}: {exc}")) from None
    return parse_description(parsed, name)


def planner(spec: Any) -> Any:
    """The planner of a validated description (every description model has a ``kind``)."""
    return _load(kind(spec.kind).planner)


def describer(spec: Any) -> Any:
    return _load(kind(spec.kind).describe)


def load_unit(data: dict[str, Any]) -> Any:
    """A plan's engine part from its recorded form ``{"kind": ..., ...}``."""
    k = kind(str(data.get("kind")))
    if k.unit is None:
        raise ClusterFileError(f"a plan of kind '{k.name}' has no engine part; the record is damaged")
    return _load(k.unit).from_dict({key: value for key, value in data.items() if key != "kind"})


def render_unit(unit: Any) -> Any:
    """The --dry-run renderer of plans with this engine part, or None for the generic text."""
    ref = kind(unit.kind).render
    return _load(ref) if ref else None
