"""Sparse autoencoders on stored activations, through SAELens (`workbench sae train`).

The activations are read from the store, never recomputed: one stored variable (`--site`, e.g.
`hidden`) at one layer, over the tokens of the chosen conditions (default: the reference). They
are read one block of rows at a time (at most `analyses.streaming.BLOCK_BYTES` decoded), shuffled
within the block, and handed to SAELens's own trainer as its data provider (an iterator of
(batch, d_in) tensors: `sae_lens.training.types.DataProvider`, sae-lens 6.54
sae_lens/training/sae_trainer.py `SAETrainer`). SAELens does everything else: the architecture
(`TopKTrainingSAE` or `StandardTrainingSAE`), the loss, the activation scaling it estimates and
folds into the weights, and the saved format (`save_inference_model`: cfg.json and
sae_weights.safetensors, read back by `sae_lens.SAE.load_from_disk`). Nothing of an SAE is
written by hand here.

The SAE's metadata says where it reads: `model_name`, `hook_name` (`<variable>.<layer>`), and
`workbench_variable`, `workbench_layer`, `workbench_conditions`, `workbench_store`, which the `sae`
analysis and the `sae_splice` intervention read.

SAELens is the optional extra `sae` (`pip install "vlm-workbench[sae]"`): without it the rest of
the workbench imports and runs, and these commands exit 2 naming the extra (`require_sae_lens`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import BadInputError

if TYPE_CHECKING:
    import torch
    import xarray as xr

EXTRA = "sae"
INSTALL_HINT = 'pip install "vlm-workbench[sae]"  (from a clone: pip install -e ".[sae]")'
ARCHITECTURES = ("topk", "standard")


def require_sae_lens(what: str) -> None:
    """Exit 2 (BadInputError) naming the extra to install when SAELens (or torch) cannot be imported."""
    try:
        import sae_lens  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        raise BadInputError(f"{what} needs SAELens, the optional extra '{EXTRA}': {INSTALL_HINT} "
                            f"(import failed: {err})") from None


@dataclass(frozen=True)
class TrainSettings:
    """What `workbench sae train` trains on and how (defaults: a TopK SAE 4x the width, k = 8)."""

    variable: str = "hidden"
    layer: int = 0
    model: str | None = None
    conditions: tuple[str, ...] = ("baseline",)
    architecture: str = "topk"
    expansion: int = 4            # d_sae = expansion x d_in, unless d_sae is given
    d_sae: int | None = None
    k: int = 8                    # topk: active features per token
    l1: float = 1.0               # standard: the L1 coefficient
    epochs: int = 10              # passes over the stored tokens
    batch_size: int = 256
    lr: float = 3e-4
    seed: int = 0
    normalize: bool = True        # SAELens's `expected_average_only_in` scaling, folded into the weights at the end


@dataclass
class TrainResult:
    out: Path
    model: str
    tokens: int
    d_in: int
    d_sae: int
    steps: int
    metadata: dict[str, object] = field(default_factory=dict)


def _open_model(store: str, model: str | None) -> tuple[str, xr.Dataset]:
    from analyses.cache import open_model
    from workbench.store import list_models

    held = list_models(store)
    if model is None:
        if len(held) != 1:
            raise BadInputError(f"--model: {store} holds {len(held)} models ({', '.join(held)}); expected one of them")
        model = held[0]
    elif model not in held:
        raise BadInputError(f"--model: no model {model!r} in {store}; expected one of {', '.join(held)}")
    return model, open_model(store, model)


def site_rows(ds: xr.Dataset, variable: str, layer: int, conditions: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """(the rows of `conditions`' tokens, the index of `layer` along the variable's layer dim),
    checked against the store: an unknown variable, layer or condition is a BadInputError."""
    from analyses.streaming import layer_values, layout

    held = [str(v) for v in ds.data_vars if "token" in ds[v].dims and ds[v].ndim == 3]
    if variable not in held:
        raise BadInputError(f"--site: no per-token, per-layer variable {variable!r} in the store; "
                            f"expected one of {', '.join(held) or 'none'}")
    _, layers = layer_values(ds, ds[variable])
    if layer not in layers.tolist():
        raise BadInputError(f"--layer: no layer {layer} of {variable!r} in the store; "
                            f"expected one of {', '.join(str(int(l)) for l in layers)}")
    lay = layout(ds, "token")
    for i, condition in enumerate(conditions):
        if condition not in lay.condition_rows:
            raise BadInputError(f"--conditions[{i}]: no condition {condition!r}; expected some of "
                                f"{', '.join(lay.conditions)}")
    rows = np.concatenate([lay.condition_rows[c] for c in conditions])
    return np.sort(rows), int(layers.tolist().index(layer))


def activation_blocks(ds: xr.Dataset, variable: str, rows: np.ndarray, layer_index: int) -> Iterator[np.ndarray]:
    """(rows, dim) float32 blocks of `variable` at one layer, in row order, each at most
    `streaming.BLOCK_BYTES` decoded."""
    from analyses import streaming

    data = streaming.as_dask(ds[variable].data)
    for _, block in streaming.row_blocks(data, rows, data.shape[2] * data.dtype.itemsize):
        yield np.asarray(block[:, layer_index].compute(), dtype=np.float32)


def activation_batches(ds: xr.Dataset, variable: str, rows: np.ndarray, layer_index: int, batch_size: int,
                       seed: int) -> Iterator[torch.Tensor]:
    """SAELens's data provider: (batch_size, dim) tensors without end, block after block and pass
    after pass over the stored rows; each block is shuffled (a fresh order every pass), and its
    last partial batch is carried into the next block's first."""
    import torch

    rng = np.random.default_rng(seed)
    carry = np.zeros((0, ds[variable].shape[2]), np.float32)
    while True:
        for block in activation_blocks(ds, variable, rows, layer_index):
            block = np.concatenate([carry, block[rng.permutation(len(block))]])
            usable = len(block) - len(block) % batch_size
            for start in range(0, usable, batch_size):
                yield torch.from_numpy(block[start:start + batch_size].copy())
            carry = block[usable:]


def training_sae(settings: TrainSettings, d_in: int, metadata: dict[str, object]):
    """SAELens's training SAE of `settings.architecture`, seeded."""
    import torch
    from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    torch.manual_seed(settings.seed)
    d_sae = settings.d_sae or settings.expansion * d_in
    common = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu",
              "normalize_activations": "expected_average_only_in" if settings.normalize else "none",
              "metadata": SAEMetadata(**metadata)}
    if settings.architecture == "topk":
        return TopKTrainingSAE(TopKTrainingSAEConfig(k=min(settings.k, d_sae), **common))
    return StandardTrainingSAE(StandardTrainingSAEConfig(l1_coefficient=settings.l1, **common))


def train_sae(store: str, out: str | Path, settings: TrainSettings, progress: bool = False) -> TrainResult:
    """Train an SAE with SAELens on `settings.variable` at `settings.layer` read from `store`,
    and save it into `out` in SAELens's format (module doc)."""
    require_sae_lens("workbench sae train")
    import torch
    from sae_lens import SAETrainer
    from sae_lens.config import LoggingConfig, SAETrainerConfig

    if settings.architecture not in ARCHITECTURES:
        raise BadInputError(f"--architecture: got {settings.architecture!r}; expected one of {', '.join(ARCHITECTURES)}")
    model, ds = _open_model(store, settings.model)
    rows, layer_index = site_rows(ds, settings.variable, settings.layer, settings.conditions)
    if not len(rows):
        raise BadInputError(f"--conditions: no tokens of {', '.join(settings.conditions)} for {model}")
    d_in = int(ds[settings.variable].shape[2])
    metadata: dict[str, object] = {
        "model_name": model, "hook_name": f"{settings.variable}.{settings.layer}",
        "workbench_variable": settings.variable, "workbench_layer": settings.layer,
        "workbench_conditions": list(settings.conditions), "workbench_store": str(store),
        "workbench_settings": json.dumps(asdict(settings))}
    sae = training_sae(settings, d_in, metadata)
    batch = min(settings.batch_size, len(rows))
    total = max(batch, settings.epochs * len(rows))
    batches_per_pass = max(1, len(rows) // batch)
    trainer_cfg = SAETrainerConfig(
        total_training_samples=total, train_batch_size_samples=batch, lr=settings.lr, device="cpu",
        lr_end=settings.lr / 10,   # what LanguageModelSAERunnerConfig sets; SAETrainerConfig leaves it None
        dead_feature_window=batches_per_pass, feature_sampling_window=batches_per_pass,
        n_batches_for_norm_estimate=min(batches_per_pass, 100), logger=LoggingConfig(log_to_wandb=False))
    provider = activation_batches(ds, settings.variable, rows, layer_index, batch, settings.seed)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=provider)
        with contextlib.nullcontext() if progress else _without_bars():
            trained = trainer.fit()
    out = Path(out)
    trained.save_inference_model(out)
    return TrainResult(out, model, len(rows), d_in, sae.cfg.d_sae, trainer.n_training_steps,
                       trained.cfg.metadata.to_dict())


@contextlib.contextmanager
def _without_bars() -> Iterator[None]:
    """SAELens's trainer draws its tqdm bars on stderr with no way to switch them off
    (sae_lens/training/sae_trainer.py `fit`, activation_scaler.py); with -q, --no-progress or no
    terminal, stderr is set aside while it trains (an error still raises)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        yield


# -- the command line --------------------------------------------------------------------------------


def _positive(value: str) -> int:
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise argparse.ArgumentTypeError(f"got {value!r}; expected an integer >= 1")


def add_sae_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`workbench sae train ...` (argparse only: SAELens loads when a command runs)."""
    sae = sub.add_parser("sae", parents=[common], help="sparse autoencoders over stored activations (SAELens)",
                         description="Sparse autoencoders through SAELens (the optional extra 'sae'): train one on "
                         "a stored variable; `workbench analyze STORE sae --sae DIR` reads it back.")
    sae_sub = sae.add_subparsers(dest="sae_command", required=True)
    train = sae_sub.add_parser("train", parents=[common], help="train an SAE on stored activations, saved in SAELens's format",
                               description="Train a sparse autoencoder with SAELens's trainer on the activations "
                               "stored in STORE (read block by block, never recomputed): one variable at one layer, "
                               "over the tokens of the given conditions. OUT receives SAELens's cfg.json and "
                               "sae_weights.safetensors (sae_lens.SAE.load_from_disk reads them).")
    train.add_argument("store", help="path to a workbench store")
    train.add_argument("--site", default="hidden", help="the stored variable (default: hidden, the residual stream)")
    train.add_argument("--layer", type=int, required=True, help="the layer of that variable")
    train.add_argument("--out", required=True, help="directory for the SAE")
    train.add_argument("--model", help="model id (required when the store holds several)")
    train.add_argument("--conditions", default="baseline", help="comma-separated conditions whose tokens train it "
                       "(default: baseline)")
    train.add_argument("--architecture", choices=ARCHITECTURES, default="topk", help="SAELens architecture (default: topk)")
    train.add_argument("--expansion", type=_positive, default=4, help="d_sae = EXPANSION x the width (default: 4)")
    train.add_argument("--d-sae", type=_positive, help="the number of features (overrides --expansion)")
    train.add_argument("-k", type=_positive, default=8, help="topk: active features per token (default: 8)")
    train.add_argument("--l1", type=float, default=1.0, help="standard: the L1 coefficient (default: 1.0)")
    train.add_argument("--epochs", type=_positive, default=10, help="passes over the stored tokens (default: 10)")
    train.add_argument("--batch-size", type=_positive, default=256, help="tokens per step (default: 256)")
    train.add_argument("--lr", type=float, default=3e-4, help="Adam's learning rate (default: 3e-4)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-normalize", action="store_true", help="train on the raw scale (default: SAELens's "
                       "expected_average_only_in scaling, folded into the saved weights)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(func=cmd_sae)


def cmd_sae(args: argparse.Namespace) -> int:
    conditions = tuple(c.strip() for c in args.conditions.split(",") if c.strip())
    settings = TrainSettings(variable=args.site, layer=args.layer, model=args.model, conditions=conditions,
                             architecture=args.architecture, expansion=args.expansion, d_sae=args.d_sae, k=args.k,
                             l1=args.l1, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                             normalize=not args.no_normalize)
    progress = not (getattr(args, "quiet", False) or args.no_progress) and sys.stderr.isatty()
    result = train_sae(args.store, args.out, settings, progress=progress)
    if not getattr(args, "quiet", False):
        print(f"trained a {settings.architecture} SAE ({result.d_in} -> {result.d_sae} features, {result.steps} steps "
              f"over {result.tokens} tokens of {', '.join(conditions)}) on {result.model}'s {settings.variable} at "
              f"layer {settings.layer}; saved in {result.out}")
        print(f"next: workbench analyze {args.store} sae --sae {result.out}")
    return 0
