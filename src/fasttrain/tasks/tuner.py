"""Lightning's tuner before fit, loaded only when a run sets one (`tuner.batch_size=power`,
`tuner.lr_find=true`): the batch size grown until it no longer fits, and the LR range test's
suggestion taken only where the curve makes it credible (`credible_lr`)."""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)


def tune(trainer: Any, model: Any, datamodule: Any, lr_find: bool = False,
         batch_size: str | None = None) -> None:  # fmt: skip
    """Before fit: grow `datamodule.batch_size` until it no longer fits (mode `batch_size`), at
    most to the training split's size; then run the LR range test, whose suggestion becomes
    `model.lr` (used by configure_optimizers) only when `credible_lr` accepts it."""
    from lightning.pytorch.tuner import Tuner

    tuner = Tuner(trainer)
    if batch_size is not None:
        datamodule.setup("fit")
        cap = len(datamodule.train_dataloader().dataset)
        # Power mode doubles from 2: stop at the first power >= the split (a batch larger than
        # the split holds the same samples, and the finder would keep doubling on it).
        trials = max(1, math.ceil(math.log2(max(cap, 2) / 2)))
        tuner.scale_batch_size(model, datamodule=datamodule, mode=batch_size, max_trials=trials)
        if datamodule.batch_size > cap:
            log.info("tuner.batch_size: %d capped to the training split's %d samples",
                     datamodule.batch_size, cap)  # fmt: skip
            datamodule.batch_size = cap
    if lr_find:
        finder = tuner.lr_find(model, datamodule=datamodule, update_attr=False)
        configured = getattr(model.optimizer_factory, "keywords", {}).get("lr")
        results = finder.results if finder is not None else {"lr": [], "loss": []}
        suggestion = finder.suggestion() if finder is not None else None
        model.lr, why = credible_lr(results["lr"], results["loss"], suggestion, configured)
        (log.info if model.lr is not None else log.warning)("tuner.lr_find: %s", why)


def credible_lr(lrs: list[float], losses: list[float], suggestion: float | None,
                configured: float | None) -> tuple[float | None, str]:  # fmt: skip
    """(the lr to train with, or None for the configured one; why) from the range test's curve.

    Lightning suggests the lr of the steepest loss descent, which on a short or noisy curve can
    land at the scan's edge or orders of magnitude below any useful lr. Accepted only inside the
    scanned range (not its first or last tenth, in log scale), on a curve whose loss really fell,
    and not 100x below a configured lr at which the curve was still falling.
    """
    keep = "keeping the configured lr" + (f" {configured:g}" if configured else "")
    pairs = [(lr, loss) for lr, loss in zip(lrs, losses, strict=False) if math.isfinite(loss)]
    if suggestion is None or len(pairs) < 10:
        return None, f"the range test gave no suggestion (too few steps); {keep}"
    low, high = math.log10(pairs[0][0]), math.log10(pairs[-1][0])
    at = (math.log10(suggestion) - low) / max(high - low, 1e-12)
    if not 0.1 <= at <= 0.9:
        return None, f"suggestion {suggestion:.3g} lies at the edge of the scanned range; {keep}"
    # The finder's first smoothed value is off (its running average starts from it); the level
    # the scan starts from is the median of the next few.
    head = sorted(loss for _, loss in pairs[1:11])
    start, best = head[len(head) // 2], min(loss for _, loss in pairs)
    if best > 0.9 * start:
        fell = f"{start:.3g} -> {best:.3g}"
        return None, f"the loss hardly fell during the range test ({fell}); {keep}"
    if configured and suggestion < configured / 100:
        at_configured = [loss for lr, loss in pairs if lr <= configured]
        if pairs[-1][0] >= configured and at_configured and at_configured[-1] < start:
            return None, (f"suggestion {suggestion:.3g} is over 100x below the configured lr, at "
                          f"which the loss still fell; {keep}")  # fmt: skip
    return suggestion, (f"lr {suggestion:.3g} (steepest loss descent; loss {start:.3g} -> "
                        f"{best:.3g} over {pairs[0][0]:.1e}..{pairs[-1][0]:.1e})")  # fmt: skip
