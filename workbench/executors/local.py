"""The local executor: the runs' traces on this machine (`workbench.backends.local`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

from .protocol import Outcome, SampleWork

if TYPE_CHECKING:
    from tqdm.std import tqdm

    from ..models.model import WorkbenchModel
    from ..models.protocol import ClientModel
    from ..plan import ModelPlan
    from ..worklist import SampleStream


class LocalExecutor:
    """Models loaded here (`WorkbenchModel`), consecutive samples' runs packed into forwards of
    up to `backend.batch_size` rows. `models`: already loaded ones, by model id (benchmarks)."""

    shares_windows = True
    samples_per_job = 1  # windows follow the batch size (`shares_windows`)

    def __init__(self, device: str = "auto", dtype: str = "auto", device_map: str | None = None,
                 log: Callable[[str], None] = print, models: dict[str, ClientModel] | None = None):
        from ..models.model import pick_device

        pick_device(device)  # a missing GPU is refused before anything is loaded or written
        self.device, self.dtype, self.device_map, self.log = device, dtype, device_map, log
        self.models = dict(models or {})

    def prepare(self, plans: list[ModelPlan], samples: SampleStream, store_exists: bool) -> None:
        return None

    def load(self, plan: ModelPlan) -> ClientModel:
        from ..models.model import WorkbenchModel

        # attention probabilities are computed from q and k (capture.attention_probabilities),
        # under the implementation NDIF also runs: no eager switch, locally or remotely
        return self.models.get(plan.info.model_id) or WorkbenchModel(
            plan.info, device=self.device, dtype=self.dtype, attn="sdpa", device_map=self.device_map)

    def notes(self, model: ClientModel, plan: ModelPlan) -> list[str]:
        from ..backends.local import unbatched_notes

        return unbatched_notes(model, plan) if plan.batch_size > 1 else []

    def execute(self, model: ClientModel, work: list[SampleWork], plan: ModelPlan,
                bar: tqdm) -> Iterator[list[Outcome]]:
        """Consecutive samples' runs as forwards of up to `plan.batch_size` rows
        (`backends.local.group_rows`: rows of one sample or of several, padded where their prompts
        differ), each forward's outcomes yielded as one group before the next forward runs."""
        from ..attribution import attribution_results, is_attribution
        from ..backends.local import Job, group_rows, pad_requirements, padding_limit, run_rows, want_sources
        from ..store import fault_point

        # an attribution scan's runs: one estimate per sample from a forward and backward of each base
        # and a forward of each donor (`workbench.attribution`), not a patched forward each
        for item in work:
            estimated = [c for c in item.conditions if is_attribution(c)]
            if estimated:
                # gradients through plain hooks on this machine's transformers model
                results = attribution_results(cast("WorkbenchModel", model), plan, item.inputs, estimated, item.sample)
                yield [Outcome(item.sample, item.inputs, c, r) for c, r in zip(estimated, results)]
        jobs = [(item.sample, item.inputs, condition) for item in work for condition in item.conditions
                if not is_attribution(condition)]
        groups = group_rows([Job(inputs, condition) for _, inputs, condition in jobs], plan.batch_size,
                            model.arch.per_token_keys, padding_limit(model, plan.capture), pad_requirements(model),
                            model.arch.deepstack, model.arch.packed_connector)
        # source values (a patch's donor) read once per sample and kept while its runs last
        # (`backends.local._site_values`); `jobs` holds every sample's inputs, so ids stay unique
        memo = want_sources([Job(inputs, condition) for _, inputs, condition in jobs], {})
        last_group = {id(jobs[i][1]): g for g, group in enumerate(groups) for i in group}
        for g, group in enumerate(groups):
            rows = [jobs[i] for i in group]
            for key in [k for k in memo if last_group[k[1] if k[0] == "want" else k[0]] < g]:
                del memo[key]  # a sample whose runs are all done
            ids = list(dict.fromkeys(sample.id for sample, _, _ in rows))
            names = list(dict.fromkeys(condition.name for _, _, condition in rows))
            # shown at the bar's next update: a forced redraw per forward cost ~20 us (a tiny forward's 0.3 %)
            bar.set_description(f"{plan.info.model_id} | {ids[0] if len(ids) == 1 else f'{len(ids)} samples'} | "
                                f"{names[0] if len(names) == 1 else f'{len(names)} conditions'}", refresh=False)
            results = run_rows(model, [Job(inputs, condition) for _, inputs, condition in rows], plan,
                               on_trace=fault_point, memo=memo)
            yield [Outcome(sample, inputs, condition, result)
                   for (sample, inputs, condition), result in zip(rows, results)]

    def describe(self) -> dict[str, Any] | None:
        return None

    def write_note(self) -> str | None:
        return None
