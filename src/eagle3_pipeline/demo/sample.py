"""Deterministic generator of the bundled demo sample (config/demo/sample.jsonl).

Rows follow open-perfectblend's schema: ``{"conversations": [{"from": "system"|"human"|"gpt",
"value": str}, ...], "source": str}``. Every row is written here from templates with seeded numbers
and every answer is computed, so the answers are correct. Regenerate the committed file with
``python -m eagle3_pipeline.demo.sample config/demo/sample.jsonl``; a unit test checks they agree.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
from pathlib import Path

from eagle3_pipeline import io
from eagle3_pipeline.demo.maths import MATH_TEMPLATES, Exchange
from eagle3_pipeline.logs import setup_logging

logger = logging.getLogger(__name__)

DEFAULT_ROWS = 360
DEFAULT_SEED = 1234
SOURCES = ("demo-math", "demo-code", "demo-chat")
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful maths tutor. Show your steps.",
    "You are a concise assistant. Keep answers short.",
    "You are a friendly teacher who explains things simply.",
    "You are a Python expert. Answer with working code.",
]
WORDS = ["banana", "python", "keyboard", "elephant", "rhythm", "sunshine", "queue", "avocado", "level"]

# (name, task, code, function of n giving the example's value)
CODE_TASKS = [
    (
        "sum_squares",
        "returns the sum of the squares of the numbers from 1 to n",
        "def sum_squares(n):\n    return sum(i * i for i in range(1, n + 1))",
        lambda n: sum(i * i for i in range(1, n + 1)),
    ),
    (
        "factorial",
        "returns n factorial",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
        "        result *= i\n    return result",
        math.factorial,
    ),
    (
        "fib",
        "returns the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        lambda n: _fib(n),
    ),
    (
        "count_multiples",
        "counts the numbers below n that are multiples of 3 or 5",
        "def count_multiples(n):\n    return sum(1 for i in range(n) if i % 3 == 0 or i % 5 == 0)",
        lambda n: sum(1 for i in range(n) if i % 3 == 0 or i % 5 == 0),
    ),
    (
        "is_prime",
        "tells whether n is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
        "        if n % d == 0:\n            return False\n    return True",
        lambda n: n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1)),
    ),
    (
        "digit_sum",
        "returns the sum of the decimal digits of n",
        "def digit_sum(n):\n    return sum(int(c) for c in str(n))",
        lambda n: sum(int(c) for c in str(n)),
    ),
]
STRING_TASKS = [
    (
        "count_vowels",
        "counts the vowels in a string",
        "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
        lambda s: sum(1 for c in s if c in "aeiou"),
    ),
    ("reverse", "reverses a string", "def reverse(s):\n    return s[::-1]", lambda s: repr(s[::-1])),
    (
        "is_palindrome",
        "tells whether a string reads the same backwards",
        "def is_palindrome(s):\n    return s == s[::-1]",
        lambda s: s == s[::-1],
    ),
]

# (term, definition, example)
CONCEPTS = [
    (
        "a prime number",
        "a whole number greater than 1 whose only divisors are 1 and itself",
        "7 is prime because only 1 and 7 divide it",
    ),
    (
        "a percentage",
        "a number expressed as a fraction of 100",
        "25% means 25 out of every 100, which is one quarter",
    ),
    (
        "an average",
        "the sum of the values divided by how many values there are",
        "the average of 2, 4 and 9 is 15 / 3 = 5",
    ),
    (
        "a function in Python",
        "a named block of code that takes inputs, does some work and can return a value",
        "def double(x): return 2 * x",
    ),
    (
        "a list in Python",
        "an ordered, changeable collection of values written in square brackets",
        "[1, 2, 3] is a list of three numbers",
    ),
    (
        "a loop",
        "a piece of code that repeats a set of steps several times",
        "for i in range(3) runs its body three times",
    ),
    (
        "photosynthesis",
        "the process by which plants turn light, water and carbon dioxide into sugar and oxygen",
        "a leaf in sunlight makes sugar and releases oxygen",
    ),
    (
        "gravity",
        "the force that pulls objects with mass towards each other",
        "an apple falls to the ground because the Earth pulls it",
    ),
    (
        "an algorithm",
        "a precise list of steps that solves a problem",
        "a recipe is an algorithm for cooking a dish",
    ),
    ("speed", "how far something travels in a unit of time", "60 km in 2 hours is a speed of 30 km/h"),
    (
        "a fraction",
        "a way to write a part of a whole as one number over another",
        "3/4 means three of four equal parts",
    ),
    ("a variable", "a name that refers to a value stored in memory", "x = 5 makes the name x refer to 5"),
    (
        "interest on a loan",
        "the extra money paid for borrowing, usually a percentage of the amount",
        "5% interest on $100 for one year is $5",
    ),
    (
        "the water cycle",
        "the movement of water through evaporation, condensation and rain",
        "sea water evaporates, forms clouds and falls as rain",
    ),
    (
        "a dictionary in Python",
        "a collection that maps keys to values",
        "{'a': 1} maps the key 'a' to the value 1",
    ),
    (
        "recursion",
        "a way of solving a problem by having a function call itself on a smaller input",
        "factorial(n) = n * factorial(n - 1)",
    ),
    (
        "an even number",
        "a whole number that can be divided by 2 with no remainder",
        "14 is even because 14 / 2 = 7",
    ),
    (
        "a unit conversion",
        "rewriting a quantity in a different unit without changing its size",
        "2 km is the same as 2000 m",
    ),
    (
        "a bug in software",
        "a mistake in a program that makes it behave wrongly",
        "using + instead of * in a formula",
    ),
    (
        "the mean and the median",
        "two kinds of average: the mean adds and divides, the median is the middle value",
        "for 1, 2 and 9 the mean is 4 and the median is 2",
    ),
]
CHAT_QUESTIONS = [
    "What is {t}?",
    "Can you explain {t}?",
    "Define {t} in one sentence.",
    "Explain {t} to a beginner.",
]
CHAT_OPENERS = ["{T} is {d}.", "Put simply, {t} is {d}.", "{T} is {d}. It is a basic idea worth knowing."]


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _code(rng: random.Random) -> list[Exchange]:
    if rng.random() < 0.35:
        name, task, code, fn = rng.choice(STRING_TASKS)
        arg = rng.choice(WORDS)
        call, value = f"{name}({arg!r})", fn(arg)
    else:
        name, task, code, fn = rng.choice(CODE_TASKS)
        arg = rng.randint(5, 30)
        call, value = f"{name}({arg})", fn(arg)
    question = f"Write a Python function that {task}. What does {call} return?"
    answer = (
        f"Here is the function:\n\n```python\n{code}\n```\n\n{call} returns {value}.\nThe answer is {value}."
    )
    follow = f"Explain how {name} works in one sentence."
    first_line = code.splitlines()[1].strip()
    follow_answer = f"The function {task}; its key line is `{first_line}`."
    return [(question, answer), (follow, follow_answer)]


def _chat(rng: random.Random) -> list[Exchange]:
    term, definition, example = rng.choice(CONCEPTS)
    question = rng.choice(CHAT_QUESTIONS).format(t=term)
    opener = rng.choice(CHAT_OPENERS).format(t=term, T=term[0].upper() + term[1:], d=definition)
    answer = f"{opener} For example, {example}."
    follow = rng.choice(["Can you give another example?", "Why does that matter?", "Summarise that briefly."])
    if follow.startswith("Why"):
        follow_answer = f"It matters because {term} comes up often, and knowing it makes later ideas easier."
    elif follow.startswith("Summarise"):
        follow_answer = f"In short: {term} is {definition}."
    else:
        follow_answer = f"Sure. Another way to see it: {example}, which fits the definition of {term}."
    return [(question, answer), (follow, follow_answer)]


def _row(rng: random.Random, source: str) -> dict:
    if source == "demo-math":
        exchanges = rng.choice(MATH_TEMPLATES)(rng)
    elif source == "demo-code":
        exchanges = _code(rng)
    else:
        exchanges = _chat(rng)
    turns = 2 if len(exchanges) > 1 and rng.random() < 0.25 else 1
    conversations: list[dict[str, str]] = []
    if rng.random() < 0.3:
        conversations.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
    for question, answer in exchanges[:turns]:
        conversations += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"conversations": conversations, "source": source}


def generate_sample(rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> list[dict]:
    """Generate the demo sample: about half maths, a quarter code and a quarter chat.

    Args:
        rows: How many rows to generate.
        seed: Seed of the random generator; the same seed gives the same rows.

    Returns:
        Rows in open-perfectblend's schema.
    """
    rng = random.Random(seed)
    weights = [0.5, 0.25, 0.25]
    return [_row(rng, rng.choices(SOURCES, weights)[0]) for _ in range(rows)]


def dumps_sample(rows: list[dict]) -> str:
    """Serialise rows as JSON lines, exactly as the committed file is written."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv: list[str]) -> None:
    """Write the sample to the path given (default config/demo/sample.jsonl)."""
    setup_logging(None, "sample")
    path = Path(argv[0] if argv else "config/demo/sample.jsonl")
    io.write_text(dumps_sample(generate_sample()), path)
    logger.info("wrote %s (%d bytes)", path, path.stat().st_size)


if __name__ == "__main__":
    main(sys.argv[1:])
