"""Writes the evaluation's shipped prompt suite and task items (qnn_infer/evaluation/data):
facts and their distractors written for this project from the tables below, seeded, so that a
change to a table shows as a diff of the JSONL it writes.

    python build-support/eval_items.py   # rewrites prompts.jsonl and tasks.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src/python/qnn_infer/evaluation/data"
SEED = 50

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow",
    "Egypt": "Cairo", "Greece": "Athens", "Ireland": "Dublin", "Austria": "Vienna",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Poland": "Warsaw", "Hungary": "Budapest", "Kenya": "Nairobi", "Peru": "Lima",
    "Argentina": "Buenos Aires", "Mexico": "Mexico City", "Canada": "Ottawa",
    "Australia": "Canberra", "India": "New Delhi", "Thailand": "Bangkok",
    "South Korea": "Seoul", "Cuba": "Havana", "Chile": "Santiago", "Belgium": "Brussels",
    "the Netherlands": "Amsterdam", "Switzerland": "Bern", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "Vietnam": "Hanoi", "Colombia": "Bogota", "Venezuela": "Caracas", "Nigeria": "Abuja",
    "Ethiopia": "Addis Ababa", "Morocco": "Rabat", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "the Czech Republic": "Prague", "Iceland": "Reykjavik", "Brazil": "Brasilia",
    "the United Kingdom": "London", "the United States": "Washington",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad",
    "light": "dark", "open": "closed", "early": "late", "full": "empty", "hard": "soft",
    "high": "low", "old": "new", "rich": "poor", "strong": "weak", "wet": "dry",
    "long": "short", "heavy": "light", "loud": "quiet", "thick": "thin", "near": "far",
    "clean": "dirty", "true": "false", "win": "lose", "buy": "sell", "first": "last",
    "inside": "outside", "day": "night", "push": "pull", "start": "finish", "love": "hate",
    "north": "south", "east": "west", "left": "right", "top": "bottom", "before": "after",
    "always": "never", "cheap": "expensive", "friend": "enemy", "question": "answer",
    "give": "take",
}
SEQUENCES = [
    ("Monday, Tuesday, Wednesday,", "Thursday"), ("Tuesday, Wednesday, Thursday,", "Friday"),
    ("Friday, Saturday,", "Sunday"), ("January, February, March,", "April"),
    ("April, May, June,", "July"), ("August, September, October,", "November"),
    ("one, two, three,", "four"), ("five, six, seven,", "eight"), ("two, four, six,", "eight"),
    ("ten, twenty, thirty,", "forty"), ("A, B, C,", "D"), ("X, Y,", "Z"),
    ("first, second, third,", "fourth"), ("spring, summer, autumn,", "winter"),
    ("morning, noon,", "night"), ("1, 2, 3, 4,", "5"), ("2, 4, 6, 8,", "10"),
    ("10, 20, 30,", "40"), ("5, 10, 15,", "20"), ("100, 200, 300,", "400"),
]
PLURALS = {
    "mouse": "mice", "child": "children", "man": "men", "woman": "women", "tooth": "teeth",
    "foot": "feet", "goose": "geese", "person": "people", "leaf": "leaves", "knife": "knives",
    "box": "boxes", "city": "cities", "wolf": "wolves", "baby": "babies", "ox": "oxen",
    "cactus": "cacti", "sheep": "sheep", "fish": "fish", "bus": "buses", "story": "stories",
}
KINDS = [
    ("A dog is a kind of", "animal", ["fruit", "metal", "tool"]),
    ("An apple is a kind of", "fruit", ["animal", "metal", "vehicle"]),
    ("A rose is a kind of", "flower", ["bird", "stone", "machine"]),
    ("Iron is a kind of", "metal", ["fruit", "insect", "song"]),
    ("A car is a kind of", "vehicle", ["vegetable", "bird", "planet"]),
    ("A sparrow is a kind of", "bird", ["fish", "tree", "tool"]),
    ("A hammer is a kind of", "tool", ["animal", "flower", "drink"]),
    ("A carrot is a kind of", "vegetable", ["metal", "vehicle", "insect"]),
    ("A salmon is a kind of", "fish", ["bird", "tree", "building"]),
    ("An oak is a kind of", "tree", ["fish", "metal", "insect"]),
    ("An ant is a kind of", "insect", ["tree", "vehicle", "fruit"]),
    ("Mars is a", "planet", ["river", "flower", "tool"]),
    ("The Nile is a", "river", ["planet", "mountain", "city"]),
    ("Everest is a", "mountain", ["river", "planet", "lake"]),
    ("A piano is a musical", "instrument", ["vegetable", "planet", "fish"]),
    ("Milk is a", "drink", ["tool", "metal", "planet"]),
    ("A violin is a", "instrument", ["vegetable", "river", "planet"]),
    ("Tuesday is a day of the", "week", ["year", "river", "planet"]),
    ("July is a month of the", "year", ["week", "river", "hour"]),
    ("Red is a", "color", ["number", "animal", "city"]),
]

# Chat prompts with one short answer (any of `answers`, case-insensitive, in the reply).
FACT_PROMPTS = [
    ("What is the capital of France?", ["Paris"]),
    ("What is the capital of Japan?", ["Tokyo"]),
    ("What is the capital of Italy?", ["Rome"]),
    ("What is the capital of Germany?", ["Berlin"]),
    ("What is the capital of Spain?", ["Madrid"]),
    ("What is the capital of Egypt?", ["Cairo"]),
    ("What is the capital of the United Kingdom?", ["London"]),
    ("What is the capital of Russia?", ["Moscow"]),
    ("How many days are in a week?", ["seven", "7"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("How many months are in a year?", ["twelve", "12"]),
    ("How many hours are in a day?", ["24", "twenty-four", "twenty four"]),
    ("How many minutes are in an hour?", ["60", "sixty"]),
    ("What is 2 plus 2?", ["4", "four"]),
    ("What is 5 times 3?", ["15", "fifteen"]),
    ("What is 10 minus 4?", ["6", "six"]),
    ("What is 9 plus 1?", ["10", "ten"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("What color is grass?", ["green"]),
    ("What color is snow?", ["white"]),
    ("What is the largest planet in our solar system?", ["Jupiter"]),
    ("Which planet is known as the Red Planet?", ["Mars"]),
    ("What is the closest star to the Earth?", ["Sun"]),
    ("What gas do plants take in from the air to make food?", ["carbon dioxide", "CO2"]),
    ("What do bees make?", ["honey"]),
    ("What is frozen water called?", ["ice"]),
    ("What is the boiling point of water in degrees Celsius?", ["100"]),
    ("What is the freezing point of water in degrees Celsius?", ["0", "zero"]),
    ("Which animal is known as the king of the jungle?", ["lion"]),
    ("What is the largest ocean on Earth?", ["Pacific"]),
    ("Who wrote Romeo and Juliet?", ["Shakespeare"]),
    ("What language is spoken in Brazil?", ["Portuguese"]),
    ("What language is spoken in Mexico?", ["Spanish"]),
    ("What is the opposite of hot?", ["cold"]),
    ("What is the opposite of up?", ["down"]),
    ("What is the plural of mouse?", ["mice"]),
    ("Which day comes after Monday?", ["Tuesday"]),
    ("Which month comes after January?", ["February"]),
    ("What is the first letter of the English alphabet?", ["A"]),
    ("How many sides does a triangle have?", ["three", "3"]),
    ("How many sides does a square have?", ["four", "4"]),
    ("What do cows drink?", ["water"]),
    ("What is the chemical symbol for water?", ["H2O"]),
    ("What organ pumps blood through the body?", ["heart"]),
    ("What is the tallest animal in the world?", ["giraffe"]),
]
# Open prompts: no single answer; compared with fp32's reply and for repetition only.
OPEN_PROMPTS = [
    "Write one sentence about the sea.",
    "Give me a tip for sleeping better.",
    "Describe a cat in a few words.",
    "Why do people like music?",
    "Tell me a short fact about the Moon.",
    "What is a good breakfast?",
    "Explain what a computer is to a child.",
    "Suggest a name for a pet dog.",
    "What should I pack for a day at the beach?",
    "Write a short greeting for a birthday card.",
]


def _choices(rng: random.Random, answer: str, pool: list[str], n: int = 3) -> tuple[list[str], int]:
    distractors = rng.sample(sorted(set(pool) - {answer}), n)
    choices = [answer, *distractors]
    rng.shuffle(choices)
    return choices, choices.index(answer)


def tasks(rng: random.Random) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []

    def add(task: str, context: str, answer: str, pool: list[str]) -> None:
        choices, index = _choices(rng, answer, pool)
        items.append({"task": task, "context": context,
                      "choices": [f" {c}" for c in choices], "answer": index})

    for country, capital in CAPITALS.items():
        add("capitals", f"The capital of {country} is", capital, list(CAPITALS.values()))
    for _ in range(50):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        op, result = rng.choice([("plus", a + b), ("minus", a - b), ("times", a * b)])
        near = [str(result + d) for d in (-10, -2, -1, 1, 2, 10)]
        add("arithmetic", f"Question: What is {a} {op} {b}?\nAnswer:", str(result), near)
    for word, opposite in OPPOSITES.items():
        add("opposites", f"The opposite of {word} is", opposite,
            [w for pair in OPPOSITES.items() for w in pair if word not in pair])
    for context, answer in SEQUENCES:
        pool = [a for _, a in SEQUENCES]
        add("sequences", context, answer, pool)
    for word, plural in PLURALS.items():
        wrong = [f"{word}s", f"{word}es", f"{word}en", plural + "s"]
        add("plurals", f"One {word}, two", plural, [w for w in wrong if w != plural])
    for context, answer, distractors in KINDS:
        add("kinds", context, answer, distractors)
    return items


def prompts() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [{"prompt": p, "answers": a} for p, a in FACT_PROMPTS]
    return rows + [{"prompt": p} for p in OPEN_PROMPTS]


def main() -> None:
    rng = random.Random(SEED)
    for name, rows in (("tasks.jsonl", tasks(rng)), ("prompts.jsonl", prompts())):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (OUT / name).write_text(text, encoding="utf-8")
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
