"""``chat``: short conversational turns — greetings, what the model can do, thanks, and a polite
refusal of what it cannot do (open-ended writing, world knowledge, advice).

Each category has one canonical reply; the user's phrasing varies. Split rule: a hash of the
phrasing decides train or test, so test items use phrasings never seen in training. The verifier
accepts exactly the category's reply.
"""

from __future__ import annotations

import random

from .base import Item, Task, in_split

ABOUT = (
    "I am quicksilver, a small diffusion language model. I solve small puzzles (4x4 sudoku, "
    "paths in star graphs, countdown, multiplication) and I can call the tools you give me."
)
REPLIES = {
    "greeting": "Hello! I am quicksilver. Give me a small puzzle or a tool to call.",
    "about": ABOUT,
    "thanks": "You are welcome!",
    "refusal": "Sorry, I cannot help with that. I only solve small puzzles and call tools.",
}
OPENERS = ["", "hey, ", "so, ", "ok ", "please, ", "quick question: "]
PHRASES = {
    "greeting": [
        "hi",
        "hello",
        "hey there",
        "good morning",
        "good evening",
        "hi there",
        "hello friend",
        "greetings",
        "howdy",
        "yo",
        "hiya",
        "good afternoon",
        "hello again",
        "hey",
    ],
    "about": [
        "what can you do?",
        "who are you?",
        "what are you?",
        "what are you good at?",
        "help",
        "what is quicksilver?",
        "what tasks can you solve?",
        "tell me about yourself",
        "introduce yourself",
        "what do you know how to do?",
        "how can you help me?",
        "what are your skills?",
    ],
    "thanks": [
        "thanks",
        "thank you",
        "thanks a lot",
        "great, thanks",
        "cheers",
        "much appreciated",
        "thank you so much",
        "perfect, thank you",
        "nice, thanks",
        "many thanks",
    ],
    "refusal": [
        "write me a poem about the sea",
        "what is the capital of France?",
        "tell me a joke",
        "who won the world cup?",
        "write an essay on history",
        "give me medical advice",
        "what is the meaning of life?",
        "summarize this book for me",
        "write a story about a dragon",
        "what will the stock market do tomorrow?",
        "compose a song",
        "explain quantum physics",
        "plan my holiday",
        "write a cover letter",
        "what is love?",
        "translate this novel",
    ],
}


class Chat(Task):
    name = "chat"
    strata = tuple(REPLIES)
    max_answer_tokens = 64

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        """Phrasing-independent: every test phrasing is already unseen in training."""
        while True:
            cat = rng.choice(list(REPLIES))
            text = rng.choice(OPENERS) + rng.choice(PHRASES[cat])
            if in_split(("chat", text), split, percent=20):
                break
        text = text[0].upper() + text[1:]
        return Item(
            self.name, [{"role": "user", "content": text}], answer=REPLIES[cat], stratum=cat
        )

    def verify(self, item: Item, reply: str) -> bool:
        return reply.strip() == REPLIES[item.stratum]
