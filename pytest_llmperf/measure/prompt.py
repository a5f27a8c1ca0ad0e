"""The prompt every benchmark sends: cut from repetitions of a fixed English paragraph.

The embedded models' tokenizer (backends/models.py) has one token per word of it, so a prompt of N
words is N tokens there; servers and other tokenizers receive the same text (their notes say how the
length they counted is checked).
"""

from __future__ import annotations

# A fixed English paragraph: prompts are cut from repetitions of it.
PROMPT_TEXT = (
    "University of Washington is a public research university in Seattle . it was founded in 1861 "
    "and is one of the oldest universities on the west coast . the main campus lies on the shores "
    "of lake washington and lake union and has more than five hundred buildings . students come "
    "from every state and from many countries to study medicine engineering law and the arts . "
)


def make_prompt(sequence_length: int) -> str:
    """A prompt of at least `sequence_length` words (tokens for the embedded tokenizer)."""
    words = PROMPT_TEXT.split()
    reps = sequence_length // len(words) + 2
    return " ".join((words * reps)[: sequence_length + 16])
