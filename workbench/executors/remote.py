"""The remote executor: one NDIF job per sample (`workbench.backends.remote`), its models the
client halves (`RemoteModel`: a processor, no weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

from .protocol import LazyInputs, Outcome, SampleWork

if TYPE_CHECKING:
    from tqdm.std import tqdm

    from ..backends.local import RunResult
    from ..backends.remote_config import RemoteConfig
    from ..models.protocol import ClientModel
    from ..models.remote import RemoteModel
    from ..plan import ConditionPlan, ModelPlan
    from ..worklist import SampleStream


class RemoteExecutor:
    """Each sample's conditions not yet stored in one remote job (batched there as locally)."""

    shares_windows = False  # a job's samples run apart on the server (each batched as locally)

    def __init__(self, config: RemoteConfig, log: Callable[[str], None] = print, samples_per_job: int = 1):
        self.config, self.log, self.samples_per_job = config, log, samples_per_job
        self.models: dict[str, ClientModel] = {}
        # (model id, sample id) -> results, of the job run before the store existed (`prepare`)
        self.held: dict[tuple[str, str], dict[str, RunResult]] = {}

    def prepare(self, plans: list[ModelPlan], samples: SampleStream, store_exists: bool) -> None:
        """The key, the versions and each model served are checked before the store is created or
        opened; and a new store is created only once the first result is in: a run that fails at
        its first job (a refused request, an error in the trace) leaves nothing on disk."""
        from ..backends.remote import prepare_remote

        self.models = prepare_remote(plans, self.config, self.log)
        sample = next(iter(samples), None)
        if self.models and sample is not None and not store_exists:
            plan = plans[0]
            model = self.models[plan.info.model_id]
            conditions = list(plan.conditions)
            self.held[(plan.info.model_id, sample.id)] = self._run(model, LazyInputs(model, sample), conditions, plan)

    def load(self, plan: ModelPlan) -> ClientModel:
        from ..backends.remote import load_remote_model

        return self.models.get(plan.info.model_id) or load_remote_model(plan.info, self.config, attn="sdpa",
                                                                         log=self.log)

    def notes(self, model: ClientModel, plan: ModelPlan) -> list[str]:
        return []

    def execute(self, model: ClientModel, work: list[SampleWork], plan: ModelPlan,
                bar: tqdm) -> Iterator[list[Outcome]]:
        """The window's samples (up to `samples_per_job`) as one job, their outcomes yielded one per
        group (a sample run before the store existed, `prepare`, is not sent again)."""
        held = {sample.id: self.held.pop((plan.info.model_id, sample.id), None) for sample, _, _ in work}
        todo = [item for item in work if held[item.sample.id] is None]
        if todo:
            count = sum(len(item.conditions) for item in todo)
            first = todo[0].sample.id if len(todo) == 1 else f"{len(todo)} samples"
            bar.set_description(f"{plan.info.model_id} | {first} | {count} condition(s) on {self.config.label}")
            held.update(zip([item.sample.id for item in todo], self._run_many(model, todo, plan)))
        for sample, inputs, conditions in work:
            results = held[sample.id]
            assert results is not None
            for condition in conditions:
                yield [Outcome(sample, inputs, condition, results[condition.name])]

    def _run(self, model: ClientModel, inputs: LazyInputs, conditions: list[ConditionPlan],
             plan: ModelPlan) -> dict[str, RunResult]:
        from ..backends.remote import run_sample

        # this executor's models (`load`, `prepare_remote`) are RemoteModels
        return run_sample(cast("RemoteModel", model), inputs, conditions, plan, self.config, log=self.log,
                          what=f"{plan.info.model_id} | {inputs.sample.id}")

    def _run_many(self, model: ClientModel, work: list[SampleWork], plan: ModelPlan) -> list[dict[str, RunResult]]:
        if len(work) == 1:
            return [self._run(model, work[0].inputs, work[0].conditions, plan)]
        from ..backends.remote import run_samples

        return run_samples(cast("RemoteModel", model), [(item.inputs, item.conditions) for item in work], plan,
                           self.config, log=self.log, what=f"{plan.info.model_id} | {work[0].sample.id} "
                           f"and {len(work) - 1} more")

    def describe(self) -> dict[str, Any] | None:
        return self.config.describe()  # where it ran; never the API key

    def write_note(self) -> str | None:
        if not self.config.simulated:
            return None
        # nnsight's remote="local" pops every non-installed module from sys.modules, process-wide,
        # while it deserializes a request: a writer thread importing (icechunk, zarr, ...) in that
        # window gets half-built modules. So the simulation writes between traces, on this thread.
        return ("note: nnsight's local simulation hides modules process-wide; results are written "
                "synchronously (no background writer)")
