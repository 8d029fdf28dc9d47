"""Maths word problems for the demo sample: templated, seeded, every step computed."""

from __future__ import annotations

import random
from collections.abc import Callable

Exchange = tuple[str, str]  # (human question, gpt answer)

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jon", "Kemi", "Leo", "Mia"]
ITEMS = [("notebooks", "pens"), ("apples", "pears"), ("tickets", "snacks"), ("shirts", "socks")]
UNITS_PER = {"km": ("m", 1000), "kg": ("g", 1000), "litres": ("ml", 1000), "hours": ("minutes", 60)}


def _money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def _shopping(rng: random.Random) -> list[Exchange]:
    name, (item_a, item_b) = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    pa, pb = rng.randint(2, 15) * 25, rng.randint(1, 12) * 25
    total = a * pa + b * pb
    bill = (total // 1000 + 1) * 1000 + rng.choice([0, 1000, 2000])
    question = (
        f"{name} buys {a} {item_a} at {_money(pa)} each and {b} {item_b} at {_money(pb)} each, "
        f"and pays with {_money(bill)}. How much change does {name} get?"
    )
    answer = (
        f"Step 1: {a} x {_money(pa)} = {_money(a * pa)}.\n"
        f"Step 2: {b} x {_money(pb)} = {_money(b * pb)}.\n"
        f"Step 3: {_money(a * pa)} + {_money(b * pb)} = {_money(total)}.\n"
        f"Step 4: {_money(bill)} - {_money(total)} = {_money(bill - total)}.\n"
        f"The answer is {_money(bill - total)}."
    )
    follow = f"What if {name} buys one more of the {item_a}?"
    new_total = total + pa
    follow_answer = f"Step 1: {_money(total)} + {_money(pa)} = {_money(new_total)}.\n" + (
        f"Step 2: {_money(bill)} - {_money(new_total)} = {_money(bill - new_total)}.\n"
        f"The answer is {_money(bill - new_total)}."
        if new_total <= bill
        else f"Step 2: {_money(new_total)} is more than {_money(bill)}, so the money is not enough.\n"
        f"The answer is that {name} is short by {_money(new_total - bill)}."
    )
    return [(question, answer), (follow, follow_answer)]


def _discount(rng: random.Random) -> list[Exchange]:
    price = rng.randint(4, 60) * 500
    pct, tax = rng.choice([10, 20, 25, 30, 40, 50]), rng.choice([5, 10, 20])
    thing = rng.choice(["jacket", "lamp", "bicycle", "backpack", "kettle", "chair"])
    cut = price * pct // 100
    sale = price - cut
    tax_cents = round(sale * tax / 100)
    final = sale + tax_cents
    question = (
        f"A {thing} costs {_money(price)}. It is discounted by {pct}% and then a {tax}% sales tax is "
        f"added. What is the final price?"
    )
    answer = (
        f"Step 1: {pct}% of {_money(price)} = {_money(cut)}.\n"
        f"Step 2: {_money(price)} - {_money(cut)} = {_money(sale)}.\n"
        f"Step 3: {tax}% of {_money(sale)} = {_money(tax_cents)}.\n"
        f"Step 4: {_money(sale)} + {_money(tax_cents)} = {_money(final)}.\n"
        f"The answer is {_money(final)}."
    )
    follow = "By what percentage did the price change overall?"
    change = (final - price) * 100 / price
    follow_answer = (
        f"Step 1: {_money(final)} - {_money(price)} = {'-' if final < price else ''}"
        f"{_money(abs(final - price))}.\n"
        f"Step 2: {_money(abs(final - price))} / {_money(price)} x 100 = {abs(change):.1f}%.\n"
        f"The answer is a {'decrease' if final < price else 'increase'} of {abs(change):.1f}%."
    )
    return [(question, answer), (follow, follow_answer)]


def _speed(rng: random.Random) -> list[Exchange]:
    name = rng.choice(NAMES)
    minutes = rng.choice([20, 30, 40, 45, 50, 60, 75, 90])
    speed_kmh = rng.choice([6, 8, 9, 10, 12, 15, 18, 20, 24, 30])
    dist_m = speed_kmh * 1000 * minutes // 60
    question = (
        f"{name} cycles {dist_m / 1000:g} km in {minutes} minutes. What is the speed in km/h and in m/s?"
    )
    ms = speed_kmh * 1000 / 3600
    answer = (
        f"Step 1: {minutes} minutes = {minutes / 60:g} hours.\n"
        f"Step 2: {dist_m / 1000:g} km / {minutes / 60:g} h = {speed_kmh} km/h.\n"
        f"Step 3: {speed_kmh} km/h = {speed_kmh} x 1000 / 3600 m/s = {ms:.2f} m/s.\n"
        f"The answer is {speed_kmh} km/h, which is {ms:.2f} m/s."
    )
    hours = rng.randint(2, 5)
    follow = f"How far does {name} go in {hours} hours at that speed?"
    far = speed_kmh * hours
    follow_answer = f"Step 1: {speed_kmh} km/h x {hours} h = {far} km.\nThe answer is {far} km."
    return [(question, answer), (follow, follow_answer)]


def _convert(rng: random.Random) -> list[Exchange]:
    unit, (small, factor) = rng.choice(list(UNITS_PER.items()))
    whole, part = rng.randint(1, 9), rng.randint(1, factor - 1)
    parts = rng.randint(2, 6)
    total = whole * factor + part
    each = total / parts
    question = (
        f"Convert {whole} {unit} and {part} {small} to {small}, then split it into {parts} equal parts. "
        f"How many {small} is each part?"
    )
    answer = (
        f"Step 1: {whole} {unit} = {whole} x {factor} = {whole * factor} {small}.\n"
        f"Step 2: {whole * factor} + {part} = {total} {small}.\n"
        f"Step 3: {total} / {parts} = {each:g} {small}.\n"
        f"The answer is {each:g} {small}."
    )
    return [(question, answer)]


def _chain(rng: random.Random) -> list[Exchange]:
    d = rng.randint(2, 9)
    a, b = rng.randint(3, 40), rng.randint(2, 9)
    c = d * rng.randint(1, 20) - (a * b) % d
    result = (a * b + c) // d
    question = f"Start with {a}. Multiply by {b}, add {c}, then divide by {d}. What is the result?"
    answer = (
        f"Step 1: {a} x {b} = {a * b}.\n"
        f"Step 2: {a * b} + {c} = {a * b + c}.\n"
        f"Step 3: {a * b + c} / {d} = {result}.\n"
        f"The answer is {result}."
    )
    return [(question, answer)]


def _add(rng: random.Random) -> list[Exchange]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "x"])
    value = {"+": a + b, "-": a - b, "x": a * b}[op]
    word = {"+": "plus", "-": "minus", "x": "times"}[op]
    question = rng.choice(
        [f"What is {a} {op} {b}?", f"Compute {a} {word} {b}.", f"How much is {a} {op} {b}?"]
    )
    return [(question, f"Step 1: {a} {op} {b} = {value}.\nThe answer is {value}.")]


def _factory(rng: random.Random) -> list[Exchange]:
    rate, hours, days = rng.randint(12, 90), rng.randint(4, 12), rng.randint(2, 7)
    pct = rng.choice([2, 4, 5, 10, 20, 25])
    made = rate * hours * days
    bad = made * pct // 100
    question = (
        f"A machine makes {rate} parts per hour and runs {hours} hours a day for {days} days. "
        f"About {pct}% of the parts are faulty. How many good parts are made?"
    )
    answer = (
        f"Step 1: {rate} x {hours} = {rate * hours} parts per day.\n"
        f"Step 2: {rate * hours} x {days} = {made} parts.\n"
        f"Step 3: {pct}% of {made} = {bad} faulty parts.\n"
        f"Step 4: {made} - {bad} = {made - bad}.\n"
        f"The answer is {made - bad} good parts."
    )
    return [(question, answer)]


def _mean(rng: random.Random) -> list[Exchange]:
    n = rng.randint(3, 6)
    scores = [rng.randint(40, 100) for _ in range(n)]
    total = sum(scores)
    question = f"A student scored {', '.join(map(str, scores))} on {n} tests. What is the mean score?"
    answer = (
        f"Step 1: {' + '.join(map(str, scores))} = {total}.\n"
        f"Step 2: {total} / {n} = {total / n:.2f}.\n"
        f"The answer is {total / n:.2f}."
    )
    return [(question, answer)]


MATH_TEMPLATES: list[Callable[[random.Random], list[Exchange]]] = [
    _shopping,
    _discount,
    _speed,
    _convert,
    _chain,
    _add,
    _factory,
    _mean,
]
