"""Layout 2: a folder of images and a text file of ``<file name> <label>`` lines."""

from __future__ import annotations

from stoker.decode.image import Box
from stoker.errors import ConfigError, LabelError, MissingFileError
from stoker.fs import PathOrURL, where
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset
from stoker.sources.index import SampleIndex, Source
from stoker.sources.untrusted import parse_label, read_text_file
from stoker.types import Transform

__all__ = ["LabelFileDataset", "read_label_file"]


def read_label_file(path: PathOrURL) -> tuple[list[str], list[int]]:
    """Parse ``<file name> <label>`` lines; blank lines and ``#`` comments are skipped.

    Raises:
        LabelError: a line has no label, a label that is not a plain integer in range, or repeats a file.
    """
    names, labels, _ = _read_label_lines(path)
    return names, labels


def _read_label_lines(path: PathOrURL) -> tuple[list[str], list[int], list[int]]:
    """``(names, labels, line numbers)`` of a label file."""
    names: list[str] = []
    labels: list[int] = []
    lines: list[int] = []
    seen: dict[str, int] = {}
    text = read_text_file(path, "label file", "'<file name> <label>' lines")
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            raise LabelError(f"{path}:{line_no}: {line!r} has no label; expected '<file name> <label>'")
        name, label_text = parts
        label = parse_label(label_text, f"{path}:{line_no}")
        if name in seen:
            raise LabelError(f"{path}:{line_no}: {name!r} is listed again (first on line {seen[name]}); list each file once")
        seen[name] = line_no
        names.append(name)
        labels.append(label)
        lines.append(line_no)
    if not names:
        raise LabelError(f"{path}: no '<file name> <label>' lines found")
    return names, labels, lines


class LabelFileDataset(FileDataset):
    """Images in a folder, labelled by a text file of ``<file name> <label>`` lines.

    This is CelebA's ``identity_CelebA.txt`` layout. Labels are used as written
    (CelebA's identities start at 1, so label 0 is simply never seen).

    Args:
        root: the folder of images.
        label_file: the text file of labels.
        crop: ``(top, left, height, width)`` applied to every image, or ``None``.
        transform: applied to the uint8 image tensor.
        on_error: ``"raise"`` or ``"skip"`` bad samples (see :class:`FileDataset`).
        name: the source name kept in shards and messages.

    Raises:
        LabelError: a bad label line (the message names the file and line).
        MissingFileError: the folder, the label file or a listed image is missing.

    Example:
        >>> ds = LabelFileDataset("data/celeba/img", "data/celeba/identity_CelebA.txt", crop=(40, 20, 138, 138))
        >>> image, label = ds[0]
        >>> tuple(image.shape)
        (3, 138, 138)
    """

    def __init__(
        self,
        root: PathOrURL,
        label_file: PathOrURL,
        crop: Box | None = None,
        transform: Transform | None = None,
        on_error: OnError = "raise",
        name: str = "labels",
    ) -> None:
        place = where(root)
        label_file = where(label_file)
        if not place.is_dir():
            raise MissingFileError(f"{place}: image folder not found")
        if crop is not None and (len(crop) != 4 or any(isinstance(v, bool) or int(v) != v or v < 0 for v in crop)
                                 or crop[2] <= 0 or crop[3] <= 0):
            raise ConfigError(
                f"crop must be four whole numbers (top, left, height, width) in pixels: top and left from 0, height "
                f"and width from 1; got {crop!r}"
            )
        names, labels, lines = _read_label_lines(label_file)
        folder = place.resolve()  # what a line names must stay inside it (links resolved)
        resolved = str(folder)
        kinds = folder.kinds()
        paths = []
        for name_, line_no in zip(names, lines, strict=True):
            found = folder.file_inside(name_, f"{label_file}:{line_no}", kinds)
            if found is None:
                raise MissingFileError(
                    f"{label_file}:{line_no}: lists {name_!r} but {place.url_of(name_)} does not exist; "
                    "restore the image or remove its line"
                )
            paths.append(found)
        box = tuple(int(v) for v in crop) if crop is not None else None
        index = SampleIndex.build(names, paths, labels, Source(name, resolved, box))  # type: ignore[arg-type]
        super().__init__(index, transform, on_error)
