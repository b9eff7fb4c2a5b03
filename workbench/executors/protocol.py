"""The executor protocol: how a run's traces get executed, here or on an NDIF server.

A run picks ONE executor at its start (`workbench.executors.choose_executor`), as nnsight
0.8.1 resolves a trace's backend once (`nnsight/modeling/mixins/remoteable.py`), and from
then on the runner only calls it: checks before the store is touched, a model per plan, and
the outcomes of a window of samples' runs. The records here are what crosses that seam.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Protocol

if TYPE_CHECKING:
    from tqdm.std import tqdm

    from ..backends.local import RunResult
    from ..data import Sample
    from ..models.model import ImageMode, ModelInputs
    from ..models.protocol import ClientModel
    from ..plan import ConditionPlan, ModelPlan
    from ..worklist import SampleStream


class LazyInputs(dict):
    """A sample's model inputs per image mode (real, blank, none), encoded on first use."""

    def __init__(self, model: ClientModel, sample: Sample):
        super().__init__()
        self.model, self.sample = model, sample

    def __missing__(self, image_mode: ImageMode) -> ModelInputs:
        self[image_mode] = self.model.encode(self.sample.image, self.sample.question, image_mode)
        return self[image_mode]


class SampleWork(NamedTuple):
    """One sample's runs still to do in a window: the sample, its inputs, its conditions."""

    sample: Sample
    inputs: LazyInputs
    conditions: list[ConditionPlan]


class Outcome(NamedTuple):
    """One run's captures, with what they belong to."""

    sample: Sample
    inputs: LazyInputs
    condition: ConditionPlan
    result: RunResult


class Executor(Protocol):
    """Where a run's traces execute (`LocalExecutor`, `RemoteExecutor`)."""

    #: consecutive samples may share forwards (a window of several samples); False: one per window
    shares_windows: bool
    #: where windows are not shared: the consecutive samples one window (a remote job) holds
    samples_per_job: int

    def prepare(self, plans: list[ModelPlan], samples: SampleStream, store_exists: bool) -> None:
        """Every check before the store is created or opened (a refusal leaves nothing on disk)."""

    def load(self, plan: ModelPlan) -> ClientModel:
        """The model that runs `plan`'s conditions (the previous one is freed first)."""

    def notes(self, model: ClientModel, plan: ModelPlan) -> list[str]:
        """What the user should know about how this model's runs are grouped."""

    def execute(self, model: ClientModel, work: list[SampleWork], plan: ModelPlan,
                bar: tqdm) -> Iterator[list[Outcome]]:
        """The window's runs, each group (one forward's, or one job's) yielded before the next runs."""

    def describe(self) -> dict[str, Any] | None:
        """Where the run executes, for its provenance record; None: here (the default)."""

    def write_note(self) -> str | None:
        """Why results must be written on the run's own thread, between traces; None: they need not."""
