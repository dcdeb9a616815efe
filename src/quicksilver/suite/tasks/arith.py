"""Arithmetic tasks: ``countdown3``/``countdown4`` (reach a target with each number once) and
``multiply`` (3-digit x 2-digit with worked partial products: the control task where AR should win).

Countdown (Gandhi et al. 2024, "Stream of Search"; Ye et al. 2024): numbers 1..40, operations
+ - * / with positive whole intermediate results, targets 10..100. Split rule: 10% of the target
values are test-only (out-of-distribution targets, as in Ye et al.). The working lists the steps
(``45+12=57,57+7=64``); the answer is one expression (``(45+12)+7``) and the verifier evaluates it
exactly (fractions) and checks that it uses every number exactly once, so any valid solution counts.

Multiply: the working is the partial products and their sum (``347*6=2082,347*80=27760,
2082+27760=29842``), the answer the product. Split rule: 10% of (a, b) pairs are test-only; the
test split is 3x2 digits, training mixes in 2x2. Strata: how many carries the long product needs.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from .base import Item, Task, in_split
from .phrasing import Phrasings, canonical_wording

OPS = "+-*/"


def apply(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    return a // b if b > 1 and a % b == 0 else None


TOKEN_RE = re.compile(r"\s*(\d+|[-+*/()])")


def eval_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the numbers used of an arithmetic expression; None if it does not parse."""
    toks: list[str] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if not m:
            return None
        toks.append(m.group(1))
        pos = m.end()
    nums: list[int] = []
    i = 0

    def expr() -> Fraction:
        nonlocal i
        v = term()
        while i < len(toks) and toks[i] in "+-":
            op = toks[i]
            i += 1
            r = term()
            v = v + r if op == "+" else v - r
        return v

    def term() -> Fraction:
        nonlocal i
        v = atom()
        while i < len(toks) and toks[i] in "*/":
            op = toks[i]
            i += 1
            r = atom()
            if op == "/":
                if r == 0:
                    raise ValueError("division by zero")
                v = v / r
            else:
                v = v * r
        return v

    def atom() -> Fraction:
        nonlocal i
        if i >= len(toks):
            raise ValueError("unexpected end")
        t = toks[i]
        i += 1
        if t == "(":
            v = expr()
            if i >= len(toks) or toks[i] != ")":
                raise ValueError("missing )")
            i += 1
            return v
        if t.isdigit():
            nums.append(int(t))
            return Fraction(int(t))
        raise ValueError(f"unexpected {t}")

    try:
        v = expr()
    except ValueError:
        return None
    if i != len(toks) or not toks:
        return None
    return v, nums


LIST_STYLES = ("{a} and {z}", "{a}, and {z}", "{a}, {z}", "{s}", "[{a}, {z}]")


def number_list(nums: list[int], style: int) -> str:
    """The numbers written one of several ways: ``45, 12 and 7``, ``45 12 7``, ``[45, 12, 7]``..."""
    head = ", ".join(map(str, nums[:-1]))
    return LIST_STYLES[style].format(a=head, z=nums[-1], s=" ".join(map(str, nums)))


COUNTDOWN_PHRASES = Phrasings(
    canonical="Use {numbers} to make {target}.",
    train=(
        "Make {target} using {numbers}.",
        "Using {numbers}, reach {target}.",
        "Numbers: {numbers}. Target: {target}.",
        "Can you get {target} from {numbers}?",
        "Combine {numbers} to get {target}, each number once.",
        "How can {numbers} make {target}?",
        "Countdown with {numbers}: make {target}.",
        "Target {target}, numbers {numbers}.",
        "Write an expression with {numbers} that equals {target}.",
        "use the numbers {numbers} to get {target}",
        "Get to {target} with {numbers} and + - * /.",
    ),
    test=(
        "Reach {target} with the numbers {numbers}.",
        "I have {numbers}. How do I get {target}?",
        "Find an expression equal to {target} using {numbers}.",
        "With {numbers}, make {target} please",
    ),
)


class Countdown(Task):
    uses_reasoning = True

    def __init__(self, n: int = 3, max_number: int = 40) -> None:
        self.n = n
        self.name = f"countdown{n}"
        self.max_number = max_number
        self.strata = ("addsub", "muldiv")
        self.max_answer_tokens = 48 if n == 3 else 72

    def _solve_random(
        self, rng: random.Random, nums: list[int]
    ) -> tuple[int, list[str], str, bool] | None:
        """Combine the numbers in a random order with random ops: (target, steps, expression, used */)."""
        pool = [(v, str(v)) for v in nums]
        rng.shuffle(pool)
        steps: list[str] = []
        muldiv = False
        while len(pool) > 1:
            (a, ea), (b, eb) = pool.pop(), pool.pop()
            op = rng.choice(OPS)
            if op in "-/" and a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            r = apply(op, a, b)
            if r is None or r <= 0 or r > 1000:
                return None
            muldiv |= op in "*/"
            steps.append(f"{a}{op}{b}={r}")
            wrap = lambda e: e if e.isdigit() else f"({e})"  # noqa: E731
            pool.insert(rng.randrange(len(pool) + 1), (r, f"{wrap(ea)}{op}{wrap(eb)}"))
        return pool[0][0], steps, pool[0][1], muldiv

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        while True:
            nums = [rng.randint(1, self.max_number) for _ in range(self.n)]
            got = self._solve_random(rng, nums)
            if got is None:
                continue
            target, steps, expression, muldiv = got
            if 10 <= target <= 100 and in_split(("countdown", target), split):
                break
        w = wording or rng
        if canonical_wording(split, phrasing):
            shown = number_list(nums, 0)
        else:
            shown = number_list(nums, w.randrange(len(LIST_STYLES)))
        template = COUNTDOWN_PHRASES.template(w, split, phrasing)
        prompt = template.format(numbers=shown, target=target)
        return Item(
            self.name,
            [{"role": "user", "content": prompt}],
            answer=expression,
            reasoning=",".join(steps),
            stratum="muldiv" if muldiv else "addsub",
            data={"numbers": nums, "target": target},
        )

    def verify(self, item: Item, reply: str) -> bool:
        got = eval_expression(reply)
        if got is None:
            return False
        value, used = got
        return value == item.data["target"] and sorted(used) == sorted(item.data["numbers"])


def carries(a: int, b: int) -> int:
    """Carries of the long multiplication a*b: in each a*digit row and in the final sum."""
    n = 0
    partials = []
    for k, d in enumerate(reversed(str(b))):
        c = 0
        for x in reversed(str(a)):
            c = (int(x) * int(d) + c) // 10
            n += c > 0
        partials.append(a * int(d) * 10**k)
    s, c = 0, 0
    for p in partials:
        s2 = s + p
        c += sum(1 for i in range(len(str(s2))) if (s // 10**i % 10) + (p // 10**i % 10) >= 10)
        s = s2
    return n + c


TIMES = ("*", " * ", "x", " x ", " × ", "×", " times ", " multiplied by ")
MULTIPLY_PHRASES = Phrasings(
    canonical="What is {a}*{b}?",
    train=(
        "What is {a}{op}{b}?",
        "Calculate {a}{op}{b}.",
        "Compute {a}{op}{b}",
        "{a}{op}{b} = ?",
        "Multiply {a} by {b}.",
        "What do you get if you multiply {a} by {b}?",
        "How much is {a}{op}{b}?",
        "Find the product of {a} and {b}.",
        "{a}{op}{b}",
        "Can you work out {a}{op}{b}?",
        "I need the answer to {a}{op}{b}.",
        "Tell me {a}{op}{b}.",
    ),
    test=(
        "What's {a}{op}{b}?",
        "Please multiply {a} and {b}.",
        "Give me the product of {a} and {b}.",
        "Quick math: {a}{op}{b}",
        "solve {a}{op}{b} for me",
    ),
)


def multiply_request(a: int, b: int, split: str, phrasing: str, w: random.Random) -> str:
    op = "*" if canonical_wording(split, phrasing) else w.choice(TIMES)
    return MULTIPLY_PHRASES.template(w, split, phrasing).format(a=a, b=b, op=op)


class Multiply(Task):
    name = "multiply"
    strata = ("carries<=5", "carries>=6")
    max_answer_tokens = 56
    uses_reasoning = True

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        while True:
            da = 3 if split == "test" or rng.random() < 0.75 else 2
            a = rng.randint(10 ** (da - 1), 10**da - 1)
            b = rng.randint(10, 99)
            if in_split(("multiply", a, b), split):
                break
        steps, partials = [], []
        for k, d in enumerate(reversed(str(b))):
            p = a * int(d) * 10**k
            partials.append(p)
            steps.append(f"{a}*{int(d) * 10**k}={p}")
        steps.append(f"{partials[0]}+{partials[1]}={a * b}")
        c = carries(a, b)
        return Item(
            self.name,
            [{"role": "user", "content": multiply_request(a, b, split, phrasing, wording or rng)}],
            answer=str(a * b),
            reasoning=",".join(steps),
            stratum="carries<=5" if c <= 5 else "carries>=6",
            data={"a": a, "b": b},
        )

    def verify(self, item: Item, reply: str) -> bool:
        r = reply.strip()
        return r.isdigit() and int(r) == item.data["a"] * item.data["b"]
