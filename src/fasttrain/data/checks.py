"""Setup-time checks of in-memory data, each a one-line UserError naming where the data came from.

- `check_rows`: enough rows for every split the fractions (or folds) cut, derived from the split's
  own size arithmetic (a `Sizes` function: rows -> (train, val, test) rows), so the minimum given
  is the one that split needs.
- `check_finite`: no NaN or inf in features or targets. Run once when the arrays load (host
  memory, numpy), never per step: a per-step check would sync the device with the host.

The in-memory data sets (fasttrain.data.arrays, .regression, .npy) run both at setup. Class labels
are integers and cannot be NaN; synthetic inputs are Gaussian draws, always finite. Images
(image_folder, cifar10, shards) reach the model as uint8 pixels and text as integer token ids
(bytes or BPE ids): neither can be NaN or inf, so they have no such check.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fasttrain.config.errors import UserError

Sizes = Callable[[int], tuple[int, int, int]]  # rows -> (train, val, test) rows
Need = tuple[int, int, int]  # the fewest rows (train, val, test) each split must get
MOST_ROWS = 2**62  # the search gives up here: fractions that small hold no usable split


def meets(sizes: Sizes, need: Need, rows: int) -> bool:
    return all(got >= least for got, least in zip(sizes(rows), need, strict=True))


def fewest_rows(sizes: Sizes, need: Need, above: int = 0) -> int:
    """The fewest rows > `above` whose split meets `need`: doubling, then bisection, which
    takes it that once a count meets `need` every larger one does. It holds for the splits here
    (shuffle_sizes, fold_sizes, and floor_sizes with need (1, 1, 1)): no split gets fewer rows
    from more rows, but floor_sizes' training split, which can lose one and stays >= 1."""
    low, high = above, max(above + 1, sum(need))
    while not meets(sizes, need, high) and high < MOST_ROWS:
        low, high = high, high * 2
    while high - low > 1:  # meets at high; low is `above` or fails
        mid = (low + high) // 2
        low, high = (low, mid) if meets(sizes, need, mid) else (mid, high)
    return high


def check_rows(rows: int, sizes: Sizes, need: Need, source: str, asked: str, why: str) -> None:
    """Refuse `rows` too few for the split: `asked` names the settings that cut it ("data.
    val_fraction=0.1 and data.test_fraction=0.1"), `why` what each split needs and why."""
    if meets(sizes, need, rows):
        return
    least = fewest_rows(sizes, need)
    if least <= rows:  # should a rounding dip ever fail past the fewest: the next that works
        least = fewest_rows(sizes, need, above=rows)
    got = "/".join(map(str, sizes(rows)))
    raise UserError(f"{source}: {rows} rows, but {asked} need at least {least} rows ({why}; "
                    f"{rows} rows split {got} train/val/test)")  # fmt: skip


def needs_text(need: Need) -> str:
    """(1, 2, 2) -> "2 in each held-out split, 1 to train"."""
    train, val, test = need
    held = f"{val} in each held-out split" if val == test else f"{val} to validate, {test} to test"
    return f"{held}, {train} to train"


def check_finite(values: np.ndarray, source: str, what: str) -> None:
    """Refuse NaN or inf anywhere in `values` [N, ...] (one sample a row) in one line: how many,
    and the first, by row and place in the row. A NaN reaches every standardised value of its
    feature and the loss: the run would finish, with a meaningless model."""
    finite = np.isfinite(values)
    bad = finite.size - int(np.count_nonzero(finite))
    if not bad:
        return
    flat = int(np.argmin(finite))  # argmin of booleans: the first False
    first = tuple(int(i) for i in np.unravel_index(flat, values.shape))
    values_word = "value" if bad == 1 else "values"
    raise UserError(f"{source}: {bad} non-finite {values_word} (NaN or inf) in {what}, the first "
                    f"at {place(first)}; clean or impute them first")  # fmt: skip


def check_finite_served(raw: np.ndarray, served: np.ndarray, source: str, what: str) -> None:
    """`check_finite` on the values as given, then, where they were wider, as served (float32,
    the same shape): a value beyond float32's range is inf there, though finite in the file."""
    check_finite(raw, source, what)
    if raw.dtype.itemsize > served.dtype.itemsize:
        check_finite(served, source, f"{what} once cast to float32 (beyond +-3.4e38 is inf)")


def place(index: tuple[int, ...]) -> str:
    """(17,) -> "row 17"; (17, 2) -> "row 17, column 2"; (17, 0, 3, 4) -> "row 17, position
    (0, 3, 4)"."""
    row, rest = index[0], index[1:]
    if not rest:
        return f"row {row}"
    if len(rest) == 1:
        return f"row {row}, column {rest[0]}"
    return f"row {row}, position ({', '.join(map(str, rest))})"


def check_class_sizes(labels: np.ndarray, source: str, where: str = "") -> None:
    """A stratified split keeps each class's share in every part: scikit-learn refuses a class
    with one row (`where`: which rows, when not all of them)."""
    classes, counts = np.unique(labels, return_counts=True)
    if len(counts) and counts.min() == 1:
        label = classes[int(np.argmin(counts))]
        raise UserError(f"{source}: class {label} has 1 row{where}; the stratified split needs "
                        "at least 2 of each class there: add rows of it or drop it")  # fmt: skip
