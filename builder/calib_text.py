"""Offline text sources for calibration (scripts/quantize_quark.py) and evaluation (builder.verify).

Nothing here downloads: a dataset is a local ``.txt`` / ``.jsonl`` / ``.json`` file, a folder written by
``datasets.Dataset.save_to_disk``, or a folder holding such text files. Hub names (``pileval``,
``wikitext``, ``org/name``) are refused with a message that says what to pass instead.
No torch import: the converter package must stay torch-free.
"""
from __future__ import annotations

import json
from pathlib import Path

BUILTIN_DATASET_NAME = "builtin"

# Plain English prose written for this project (public-domain style, no copied corpus). About 2.4k
# characters: enough for a few calibration windows of a small model and a short perplexity check.
BUILTIN_TEXT = """\
The river town woke slowly on market day. Before the sun cleared the hills, the baker had already
pulled the first loaves from the oven, and the smell of bread drifted down the narrow street toward
the water. Fishermen checked their nets on the pier while gulls argued over scraps. A boy with a cart
full of apples stopped to watch the boats, then remembered his mother's warning and hurried on.

In the square, traders set up tables of cloth, copper pots, candles, and jars of honey. An old woman
sold herbs tied in small bundles: mint for tea, thyme for soup, and lavender to keep moths away from
wool. She told every customer the same story about the winter the river froze solid, when children
skated from one bank to the other and the mayor fell through the ice trying to prove it was safe.

Computers follow instructions exactly, which is both their strength and their weakness. A program
that adds two numbers will do so a billion times without error, yet it cannot guess what a person
meant when the instruction was wrong. Good software therefore checks its inputs, reports problems in
plain words, and leaves the user with a clear idea of what to do next. Engineers measure the speed of
their code, but they also measure how often it surprises the people who depend on it.

A language model predicts the next word from the words before it. During training it reads a large
amount of text and adjusts millions of numbers so that its guesses become less wrong. Quantization
stores those numbers with fewer bits, for example four bits instead of sixteen, which makes the model
smaller and often faster. The cost is a small loss of accuracy, and careful methods try to keep that
loss as small as possible by choosing scales and rounding with the help of real example text.

The weather turned in the afternoon. Clouds rolled in from the west, the wind lifted the awnings, and
the traders began to pack their goods. By evening the square was empty except for a cat asleep on a
warm step. In the houses along the river, families sat down to supper, counted the day's coins, and
talked about the price of flour, the new bridge, and whether the rain would last until morning.

Numbers tell their own stories. One, two, three, four, five, six, seven, eight, nine, ten. The year
has twelve months and the week has seven days. Water boils at one hundred degrees Celsius at sea
level, and a kilometre is a thousand metres. Questions and answers: What is the capital of France?
Paris. How many legs does a spider have? Eight. Which planet is closest to the sun? Mercury.
"""

# Prompts used by builder.verify for greedy agreement when the user gives none.
DEFAULT_PROMPTS = (
    "The river town woke slowly on",
    "A language model predicts",
    "What is the capital of France?",
)

TEXT_FIELDS = ("text", "content", "document", "article", "sentence")


class DatasetSourceError(ValueError):
    """A --dataset / --text value that cannot be read offline. The message is one line."""


def _texts_from_jsonl(path: Path) -> list[str]:
    texts = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetSourceError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from None
        texts.append(_text_of_record(record, f"{path}:{line_number}"))
    return texts


def _text_of_record(record, where: str) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        for field in TEXT_FIELDS:
            if isinstance(record.get(field), str):
                return record[field]
    raise DatasetSourceError(f"{where}: record has no text field (looked for {', '.join(TEXT_FIELDS)})")


def _texts_from_json(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetSourceError(f"{path}: not valid JSON ({exc.msg})") from None
    records = data if isinstance(data, list) else [data]
    return [_text_of_record(r, f"{path}[{i}]") for i, r in enumerate(records)]


def _texts_from_saved_dataset(folder: Path) -> list[str]:
    try:
        import datasets  # optional dependency, only for folders written by save_to_disk
    except ImportError:
        raise DatasetSourceError(
            f"{folder} looks like a datasets.save_to_disk folder but the 'datasets' package is not installed"
        ) from None
    loaded = datasets.load_from_disk(str(folder))
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        loaded = loaded[split]
    field = next((f for f in TEXT_FIELDS if f in loaded.column_names), None)
    if field is None:
        raise DatasetSourceError(
            f"{folder}: dataset columns {loaded.column_names} have no text column (looked for {', '.join(TEXT_FIELDS)})"
        )
    return [t for t in loaded[field] if isinstance(t, str)]


def _texts_from_file(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _texts_from_jsonl(path)
    if suffix == ".json":
        return _texts_from_json(path)
    return [path.read_text(encoding="utf-8")]


def load_texts(source: str | None) -> list[str]:
    """Texts from ``source``: None or "builtin" -> the built-in text; else a local file or folder."""
    if source is None or source == BUILTIN_DATASET_NAME:
        return [BUILTIN_TEXT]
    path = Path(source).expanduser()
    if path.is_file():
        texts = _texts_from_file(path)
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            texts = _texts_from_saved_dataset(path)
        else:
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".txt", ".jsonl", ".json"))
            if not files:
                raise DatasetSourceError(
                    f"{path}: folder has no .txt/.jsonl/.json files and is not a datasets.save_to_disk folder"
                )
            texts = [t for f in files for t in _texts_from_file(f)]
    else:
        raise DatasetSourceError(
            f"dataset '{source}' is not a local file or folder; hub datasets cannot be fetched here: "
            f"pass a .txt/.jsonl file, a datasets.save_to_disk folder, or '{BUILTIN_DATASET_NAME}'"
        )
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise DatasetSourceError(f"{source}: no non-empty text found")
    return texts


def check_source(source: str | None) -> None:
    """Cheap existence check (no reading), so a bad --dataset fails before slow work starts."""
    if source is None or source == BUILTIN_DATASET_NAME:
        return
    if not Path(source).expanduser().exists():
        load_texts(source)  # raises the one-line DatasetSourceError
