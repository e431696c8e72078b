"""A mixed corpus for the quality filters' parity test and bench: English prose, web-like pages, code, CJK,
boilerplate, repetition, personal data and degenerate records, made offline from the standard library (as
the sample corpus is) and a seeded generator, so every machine builds the same documents for its Python."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from stoker_local import sample

BOILERPLATE = [
    "Home", "About us", "Contact", "Log in", "Sign up", "Search", "Menu", "Share on Facebook", "Tweet",
    "This site uses cookies to improve your experience.", "Read our privacy policy and terms of use.",
    "All rights reserved.", "Subscribe to our newsletter", "Click here to read more...", "Next page »",
    "Enable JavaScript to view this page.", "Posted by admin", "Leave a comment", "#news #today #follow",
]
LOREM = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
         "dolore magna aliqua.")
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]


def _code_chunks(limit: int) -> list[str]:
    """Runs of 10-60 lines of the standard library's Python source."""
    stdlib, out = Path(sysconfig.get_paths()["stdlib"]), []
    rng = random.Random(7)
    for path in sorted(stdlib.glob("*.py")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for start in range(0, max(len(lines) - 10, 1), 120):
            out.append("\n".join(lines[start:start + rng.randint(10, 60)]))
            if len(out) >= limit:
                return out
    return out


def _page(rng: random.Random, prose: list[str]) -> str:
    """A web-like page: navigation, a few paragraphs of prose, a footer."""
    head = rng.sample(BOILERPLATE, rng.randint(0, 6))
    body = [rng.choice(prose).replace("\n", " ") for _ in range(rng.randint(1, 6))]
    foot = rng.sample(BOILERPLATE, rng.randint(0, 4))
    return "\n".join(head + [""] + body + [""] + foot)


def _repetitive(rng: random.Random, prose: list[str]) -> str:
    kind = rng.randrange(4)
    para = rng.choice(prose)
    if kind == 0:  # the same paragraph again and again
        return "\n\n".join([para] * rng.randint(2, 5) + [rng.choice(prose)])
    if kind == 1:  # repeated lines among others
        lines = para.splitlines() or [para]
        return "\n".join(rng.choice(lines) for _ in range(rng.randint(5, 30)))
    if kind == 2:  # a spammed phrase inside prose
        words = para.split()
        phrase = " ".join(words[:rng.randint(2, 4)]) or "buy now"
        return " ".join(words + [phrase] * rng.randint(3, 30))
    return "\n".join(f"- {rng.choice(BOILERPLATE)}" for _ in range(rng.randint(3, 20)))


def _personal(rng: random.Random, prose: list[str]) -> str:
    text = rng.choice(prose)
    name, host = rng.choice(NAMES), rng.choice(["example.org", "mail.test.com", "uni-x.edu"])
    ip = rng.choice([f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                     f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}", "127.0.0.1", "10.0.0.7"])
    return f"{text}\nWrite to {name}.{rng.choice(NAMES)}@{host} or reach the server at {ip}. Thanks to {name}!"


def _degenerate(rng: random.Random) -> str:
    return rng.choice(["...", "#", "- a\n- b", "{}", "IS_ALPHA IS_ALPHA and the", "word", "?!", "…" * 20,
                       "the " * 60, "a\n" * 40, "https://example.com/" + "x" * 1200, LOREM])


def documents(n: int = 10_000, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (kind, text) pairs: prose, page, code, cjk, boilerplate, repetitive, personal, lorem, degenerate."""
    rng = random.Random(seed)
    base = sample.documents(max_docstring_bytes=1_500_000)
    prose = [d["text"] for d in base if d["source"] == "docstring"]
    cjk = [d["text"] for d in base if d["source"] == "cjk"]
    code = _code_chunks(2_000)
    makers = [
        ("prose", 30, lambda: rng.choice(prose)),
        ("page", 20, lambda: _page(rng, prose)),
        ("code", 12, lambda: rng.choice(code)),
        ("cjk", 6, lambda: "\n".join(rng.choice(cjk) for _ in range(rng.randint(1, 4)))),
        ("boilerplate", 8, lambda: "\n".join(rng.sample(BOILERPLATE, rng.randint(2, 12)))),
        ("repetitive", 10, lambda: _repetitive(rng, prose)),
        ("personal", 8, lambda: _personal(rng, prose)),
        ("lorem", 2, lambda: _page(rng, prose) + "\n" + LOREM),
        ("degenerate", 4, lambda: _degenerate(rng)),
    ]
    kinds, weights = [m[0] for m in makers], [m[1] for m in makers]
    make = dict((m[0], m[2]) for m in makers)
    return [(k, make[k]()) for k in rng.choices(kinds, weights, k=n)]
