"""Long fuzz of the decode paths: crafted PNGs (valid CRCs, broken data) and crafted JPEGs, outcome per mutation.

Every case is made from its number alone (:func:`fuzzing.png.png_case`), so a bad
outcome is reproduced with ``png_case(n)``. Cases decode in a guarded child process,
so a crash is counted instead of ending the run. The same cases (the first
``--baseline`` of them) also go through ``torchvision.io.decode_image`` alone, to show
what the guard prevents. ``--also`` feeds all the cases to candidate libraries alone
(``pyspng``, ``imagecodecs``'s libpng, ``imagecodecs-spng``, ``pillow``), one line each,
to judge a decoder before stoker uses it.

``--jpeg N`` (default 5,000) reads N crafted JPEGs (:func:`fuzzing.jpeg.jpeg_case`:
mutated headers, sampling factors such as luma 0x14, huge declared sizes such as
48679x59164) four ways each: as files, from an encoded shard set by the batch and by the
row path, and through ``stoker verify``; it prints one table per path, with every case's
memory held to ``--memory-mib`` (tracemalloc peak and resident-set growth).

Run::

    python benchmarks/fuzz_decode.py --cases 10000 --baseline 1000 --json fuzz.json
    python benchmarks/fuzz_decode.py --cases 0 --baseline 0 --jpeg 5000  # the JPEG arm alone
    python benchmarks/fuzz_decode.py --cases 10000 --baseline 0 --also pyspng imagecodecs imagecodecs-spng
    python benchmarks/fuzz_decode.py --cases 300 --baseline 0     # quick

Prints a markdown table (the one in ``docs/reliability.md``); exits 1 on any crash or
any error outside stoker's family.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from stoker.decode.image import png_decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # the fuzz tooling (not shipped)
from fuzzing.jpeg import JPEG_MUTATIONS, JPEG_OUTCOMES, JPEG_PATHS, run_jpeg_guarded  # noqa: E402
from fuzzing.png import DECODERS, OUTCOMES, PNG_MUTATIONS, run_guarded  # noqa: E402


def table(stoker: Counter[tuple[str, str]], baseline: Counter[tuple[str, str]]) -> str:
    """The markdown table of outcomes by mutation."""
    head = "| mutation (CRCs valid) | cases | " + " | ".join(OUTCOMES) + " | torchvision alone: crashed |"
    lines = [head, "|---" * (len(OUTCOMES) + 3) + "|"]
    for kind in (*PNG_MUTATIONS, "all"):
        def count(c: Counter[tuple[str, str]], outcome: str | None, kind: str = kind) -> int:
            return sum(n for (k, o), n in c.items() if (kind == "all" or k == kind) and (outcome is None or o == outcome))

        base = count(baseline, None)
        crashed = f"{count(baseline, 'crash')} of {base}" if base else "not run"
        cells = [str(count(stoker, o)) for o in OUTCOMES]
        name = f"**{kind}**" if kind == "all" else kind
        lines.append(f"| {name} | {count(stoker, None)} | " + " | ".join(cells) + f" | {crashed} |")
    return "\n".join(lines)


def jpeg_table(counts: Counter[tuple[str, str, str]]) -> str:
    """The markdown table of the JPEG arm: a row per mutation, the outcomes of each path."""
    head = "| mutation | cases | " + " | ".join(f"{p}: ok / DecodeError / bad" for p in JPEG_PATHS) + " |"
    lines = [head, "|---" * (len(JPEG_PATHS) + 2) + "|"]
    for kind in (*JPEG_MUTATIONS, "all"):
        def count(path: str, outcomes: tuple[str, ...], kind: str = kind) -> int:
            return sum(n for (p, k, o), n in counts.items() if p == path and (kind == "all" or k == kind) and o in outcomes)

        bad = tuple(o for o in JPEG_OUTCOMES if o not in ("decoded", "DecodeError"))
        cells = [f"{count(p, ('decoded',))} / {count(p, ('DecodeError',))} / {count(p, bad)}" for p in JPEG_PATHS]
        name = f"**{kind}**" if kind == "all" else kind
        lines.append(f"| {name} | {count('file', JPEG_OUTCOMES)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="crafted PNGs through stoker's decoder")
    parser.add_argument("--baseline", type=int, default=1_000, help="the first N also through torchvision alone (0: skip)")
    parser.add_argument("--also", nargs="*", default=[], choices=[d for d in DECODERS if d not in ("stoker", "torchvision")],
                        help="libraries alone to feed every case to as well (any exception counts as a clear error)")
    parser.add_argument("--jpeg", type=int, default=5_000, help="crafted JPEGs through files, encoded shards and verify (0: skip)")
    parser.add_argument("--memory-mib", type=int, default=256, help="the most one JPEG case may allocate or touch")
    parser.add_argument("--json", help="also write the counts to this file (for benchmarks/reliability_table.py)")
    args = parser.parse_args()
    start = time.perf_counter()
    stoker = run_guarded("png", range(args.cases), timeout_s=3600) if args.cases else Counter()
    peaks: dict[str, int] = {}
    jpegs = (run_jpeg_guarded(range(args.jpeg), memory_bound_bytes=args.memory_mib << 20, timeout_s=3600, peaks=peaks)
             if args.jpeg else Counter())
    baseline = run_guarded("png", range(args.baseline), timeout_s=3600, decoder="torchvision") if args.baseline else Counter()
    alone = {name: run_guarded("png", range(args.cases), timeout_s=3600, decoder=name) for name in args.also}
    if args.cases:
        print(table(stoker, baseline))
    if args.jpeg:
        print(f"\n{args.jpeg:,} crafted JPEGs, each read as a file, from an encoded shard set (batch, row) and by verify "
              f"(bad: any other error, over {args.memory_mib} MiB, a crash, or verify ok where a read failed):\n")
        print(jpeg_table(jpegs))
        print("\nmost memory one case took (tracemalloc peak or resident-set growth; verify: per block of 100): "
              + ", ".join(f"{path} {peaks.get(path, 0) / 2**20:,.1f} MiB" for path in JPEG_PATHS))
    print(f"\n{args.jpeg:,} JPEG cases x {len(JPEG_PATHS)} paths; {args.cases:,} PNG cases through stoker (PNG decoder: {png_decoder()}), {args.baseline:,} through "
          f"torchvision alone, in {time.perf_counter() - start:,.0f} s")
    for name, counts in alone.items():
        totals = Counter()
        for (_, outcome), n in counts.items():
            totals[outcome] += n
        print(f"{name} alone, {args.cases:,} cases: " + ", ".join(f"{totals[o]:,} {o}" for o in OUTCOMES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stoker": [[k, o, n] for (k, o), n in sorted(stoker.items())],
                       "torchvision": [[k, o, n] for (k, o), n in sorted(baseline.items())],
                       "jpeg": [[p, k, o, n] for (p, k, o), n in sorted(jpegs.items())],
                       **{name: [[k, o, n] for (k, o), n in sorted(c.items())] for name, c in alone.items()}}, f, indent=1)
    bad = sum(n for (_, o), n in stoker.items() if o in ("crash", "other error"))
    bad += sum(n for (_, _, o), n in jpegs.items() if o not in ("decoded", "DecodeError"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
