"""Where two callgrind dumps differ: each function's own instructions (self cost) and the calls between functions,
highest difference first. Made to compare one counted region (a decode step) of two counting processes of the same
code (scripts/instruction_spread.py --keep-dumps): docs/notes/instructions.md found the spread that way ("Where the
spread comes from").
Usage: python scripts/callgrind_diff.py DUMP_A DUMP_B [--top 25] [--calls]
"""

import argparse
import re
from collections import Counter
from pathlib import Path

_NAMED = re.compile(r"(c?fn)=\((\d+)\)(?: (.*))?")


def parse(path: Path) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Self cost per function and call counts per (caller, callee) of a dump (callgrind's compressed names)."""
    names: dict[str, str] = {}
    own: Counter[str] = Counter()
    calls: Counter[tuple[str, str]] = Counter()
    fn = cfn = ""
    after_call = False
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            named = _NAMED.match(line.rstrip("\n"))
            if named:
                kind, number, name = named.groups()
                if name:
                    names[number] = name
                if kind == "fn":
                    fn = names[number]
                else:
                    cfn = names[number]
                continue
            if line.startswith("calls="):
                calls[(fn, cfn)] += int(line.split()[0].split("=")[1])
                after_call = True  # the next cost line is the call's inclusive cost, not the caller's own
                continue
            if not line[:1] or line[0] not in "+-*0123456789":
                continue
            if after_call:
                after_call = False
                continue
            parts = line.split()
            if len(parts) > 1 and fn:
                own[fn] += int(parts[-1])
    return own, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--calls", action="store_true", help="also the call counts that differ")
    args = parser.parse_args()
    (own_a, calls_a), (own_b, calls_b) = parse(args.a), parse(args.b)
    total_a, total_b = sum(own_a.values()), sum(own_b.values())
    print(f"total {total_a:,} - {total_b:,} = {total_a - total_b:+,}")
    diffs = sorted(((own_a[f] - own_b[f], f) for f in own_a.keys() | own_b.keys()), key=lambda d: -abs(d[0]))
    for diff, name in diffs[:args.top]:
        if diff:
            print(f"{diff:+12,} {own_a[name]:14,} {own_b[name]:14,}  {name}")
    if args.calls:
        changed = sorted(((calls_a[k] - calls_b[k], k) for k in calls_a.keys() | calls_b.keys()),
                         key=lambda d: -abs(d[0]))
        for diff, (caller, callee) in changed[:args.top]:
            if diff:
                print(f"calls {diff:+8,} {calls_a[(caller, callee)]:8,} {calls_b[(caller, callee)]:8,}  "
                      f"{caller} -> {callee}")


if __name__ == "__main__":
    main()
