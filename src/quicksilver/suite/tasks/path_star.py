"""``path_star``: find the path from the centre of a star graph to a named leaf.

The graph (Bachmann & Nagarajan 2024, "The pitfalls of next-token prediction"): a centre node with
``degree`` arms of ``path_len - 1`` nodes each; node labels are distinct two-digit numbers from
00..49, edges are listed as ``a>b`` (directed away from the centre) in random order. Left to right
the first step is the hard one (which arm leads to the goal?); backwards every step is a lookup,
which is why teacher-forced AR models stall near 1/degree while masked diffusion can decode from
the goal end. Split rule: the hash of the (centre, goal-arm) labels decides the split, so a test
graph never appears in training. Strata: degree 2 and degree 3.
"""

from __future__ import annotations

import random

from .base import Item, Task, in_split
from .phrasing import Phrasings, canonical_wording

N_NODES = 50
PATH_LEN = 5


def fmt(n: int) -> str:
    return f"{n:02d}"


EDGE_STYLES = (
    ("{a}>{b}", " "),
    ("{a}->{b}", " "),
    ("{a}>{b}", ", "),
    ("{a} -> {b}", ", "),
    ("{a}>{b}", "; "),
)
PATH_PHRASES = Phrasings(
    canonical="Edges: {edges}\nFind the path from {start} to {goal}.",
    train=(
        "Graph: {edges}\nWhat is the path from {start} to {goal}?",
        "Edges {edges}. Path from {start} to {goal}?",
        "Given the edges {edges}, find the route from {start} to {goal}.",
        "Find the path from {start} to {goal}. Edges: {edges}",
        "{edges}\nGo from {start} to {goal}.",
        "Directed edges: {edges}\nList the nodes from {start} to {goal}.",
        "In the graph {edges}, how do you get from {start} to {goal}?",
    ),
    test=(
        "Here are the edges: {edges}\nHow do I get from {start} to {goal}?",
        "Which path leads from {start} to {goal}? The edges are {edges}",
        "Route from {start} to {goal} using {edges}",
    ),
)


class PathStar(Task):
    name = "path_star"
    strata = ("deg2", "deg3")
    max_answer_tokens = 40

    def __init__(self, degrees: tuple[int, ...] = (2, 3), path_len: int = PATH_LEN) -> None:
        self.degrees = degrees
        self.path_len = path_len

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        while True:
            deg = rng.choice(self.degrees)
            nodes = rng.sample(range(N_NODES), 1 + deg * (self.path_len - 1))
            centre, rest = nodes[0], nodes[1:]
            arms = [
                rest[i * (self.path_len - 1) : (i + 1) * (self.path_len - 1)] for i in range(deg)
            ]
            if in_split((centre, tuple(arms[0])), split):
                break
        edges = []
        for arm in arms:
            prev = centre
            for n in arm:
                edges.append((prev, n))
                prev = n
        rng.shuffle(edges)
        goal_arm = arms[0]
        path = [centre, *goal_arm]
        w = wording or rng
        edge, sep = EDGE_STYLES[
            0 if canonical_wording(split, phrasing) else w.randrange(len(EDGE_STYLES))
        ]
        shown = sep.join(edge.format(a=fmt(a), b=fmt(b)) for a, b in edges)
        template = PATH_PHRASES.template(w, split, phrasing)
        prompt = template.format(edges=shown, start=fmt(centre), goal=fmt(goal_arm[-1]))
        return Item(
            self.name,
            [{"role": "user", "content": prompt}],
            answer=">".join(fmt(n) for n in path),
            stratum=f"deg{deg}",
            data={"edges": edges, "start": centre, "goal": goal_arm[-1]},
        )

    def verify(self, item: Item, reply: str) -> bool:
        """Any walk along listed edges from the start to the goal is right (in a star it is unique)."""
        parts = reply.strip().split(">")
        try:
            nodes = [int(p) for p in parts]
        except ValueError:
            return False
        if any(len(p) != 2 for p in parts) or len(nodes) < 2:
            return False
        edges = {tuple(e) for e in item.data["edges"]}
        if nodes[0] != item.data["start"] or nodes[-1] != item.data["goal"]:
            return False
        return all((a, b) in edges for a, b in zip(nodes, nodes[1:]))
