"""Mercury Edit's message formats, in one place: what the edit routes accept and the suite trains on.

Apply-edit (``POST /v1/apply/completions``): one user message holding the original code and an
update snippet in tagged sections; the reply is the merged code. Next-edit
(``POST /v1/edit/completions``): one user message holding recently viewed snippets, the current file
with an editable region around a cursor marker, and the recent edits as unified diffs; the reply is
the rewritten editable region. The tags follow Inception's published client formats
(``../shared/reference/edit_endpoints.md``); the system prompts are ours, kept server-side as
Inception keeps its own, and are the ones the embedded model was trained with.

Replies are the bare code: no ``<|updated_code|>`` wrapper (clients that strip one accept a reply
without it); ``strip_wrapper`` removes one if a model writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

APPLY_SYSTEM = (
    "You merge an update snippet into the original code. Reply with the complete updated code, "
    "nothing else."
)
NEXT_EDIT_SYSTEM = (
    "You predict the developer's next edit. Rewrite the code to edit, continuing the recent "
    "edits, and reply with the rewritten region only, without the cursor marker."
)

ORIGINAL = "original_code"
UPDATE = "update_snippet"
RECENT = "recently_viewed_code_snippets"
SNIPPET = "recently_viewed_code_snippet"
CURRENT = "current_file_content"
TO_EDIT = "code_to_edit"
HISTORY = "edit_diff_history"
CURSOR = "<|cursor|>"
UPDATED = "updated_code"


def _open(tag: str) -> str:
    return f"<|{tag}|>"


def _close(tag: str) -> str:
    return f"<|/{tag}|>"


def section(tag: str, body: str) -> str:
    """``<|tag|>`` body ``<|/tag|>``, each on its own line."""
    return f"{_open(tag)}\n{body.rstrip(chr(10))}\n{_close(tag)}"


class FormatError(ValueError):
    """A message that lacks a section the route needs (the server answers 400 naming it)."""


def find(tag: str, text: str) -> str:
    """The body of the first ``tag`` section in ``text``, without the newlines around it."""
    m = re.search(re.escape(_open(tag)) + r"\n?(.*?)\n?" + re.escape(_close(tag)), text, re.S)
    if m is None:
        raise FormatError(f"the message has no {_open(tag)} ... {_close(tag)} section")
    return m.group(1)


def apply_message(original: str, update: str) -> str:
    """The apply-edit user message."""
    return section(ORIGINAL, original) + "\n\n" + section(UPDATE, update)


@dataclass
class ApplyRequest:
    original: str
    update: str


def parse_apply(text: str) -> ApplyRequest:
    return ApplyRequest(find(ORIGINAL, text), find(UPDATE, text))


@dataclass
class Snippet:
    path: str
    code: str


@dataclass
class NextEditRequest:
    recent: list[Snippet]
    path: str
    above: str  # the file before the editable region
    region: str  # the editable region, with CURSOR somewhere in it
    below: str  # the file after it
    history: str  # unified diffs of the recent edits, newest last


def next_edit_message(req: NextEditRequest) -> str:
    """The next-edit user message."""
    snippets = "\n".join(
        section(SNIPPET, f"code_snippet_file_path: {s.path}\n{s.code}") for s in req.recent
    )
    current = "\n".join(
        part
        for part in (
            f"current_file_path: {req.path}",
            req.above.rstrip("\n"),
            section(TO_EDIT, req.region),
            req.below.rstrip("\n"),
        )
        if part
    )
    return "\n".join(
        (section(RECENT, snippets), section(CURRENT, current), section(HISTORY, req.history))
    )


def parse_next_edit(text: str) -> NextEditRequest:
    """The sections of a next-edit message (recently viewed snippets and history may be empty)."""
    current = find(CURRENT, text)
    region = find(TO_EDIT, current)
    if CURSOR not in region:
        raise FormatError(f"the {_open(TO_EDIT)} section has no {CURSOR} marker")
    head, _, rest = current.partition(_open(TO_EDIT))
    _, _, below = rest.partition(_close(TO_EDIT))
    path, _, above = head.partition("\n")
    recent = []
    for body in re.findall(
        re.escape(_open(SNIPPET)) + r"\n?(.*?)\n?" + re.escape(_close(SNIPPET)),
        find(RECENT, text),
        re.S,
    ):
        first, _, code = body.partition("\n")
        recent.append(Snippet(first.removeprefix("code_snippet_file_path:").strip(), code))
    return NextEditRequest(
        recent=recent,
        path=path.removeprefix("current_file_path:").strip(),
        above=above,
        region=region,
        below=below.lstrip("\n"),
        history=find(HISTORY, text),
    )


def strip_wrapper(reply: str) -> str:
    """A reply without an ``<|updated_code|>`` ... ``<|/updated_code|>`` wrapper, if it has one."""
    m = re.fullmatch(
        r"\s*" + re.escape(_open(UPDATED)) + r"\n?(.*?)\n?" + re.escape(_close(UPDATED)) + r"\s*",
        reply,
        re.S,
    )
    return m.group(1) if m else reply
