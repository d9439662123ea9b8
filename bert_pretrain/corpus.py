"""The built-in default corpus: a generated encyclopedia of entities, with SQuAD-style questions about it.

Deterministic from a seed. Each article describes one entity (person, city, company or river) with several
attributes written through varied sentence templates, over several paragraphs, with cross references to other
entities. Every fact a question asks about is stated in the paragraph given as its context, and the answer's
character offset is recorded when the sentence is written, so ``context[answer_start:]`` starts with the answer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vor", "sel", "an", "du", "bri", "nel", "os", "tar", "ul", "gen",
             "pa", "zi", "hol", "mer", "quin", "ba", "ce", "fi", "ju", "ros", "wen", "yl", "dor", "ith", "ma"]
FIRST_NAMES = ["Alma", "Bruno", "Clara", "Dario", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Karin",
               "Leon", "Mira", "Nils", "Olga", "Paul", "Rosa", "Stefan", "Tilda", "Victor", "Wanda", "Yusuf"]
PROFESSIONS = ["painter", "physicist", "architect", "composer", "novelist", "chemist", "sculptor", "engineer",
               "astronomer", "poet", "botanist", "cartographer"]
INDUSTRIES = ["shipbuilding", "textiles", "software", "mining", "publishing", "brewing", "aviation", "glassmaking",
              "pharmaceuticals", "railways"]
COLORS = ["red", "blue", "green", "golden", "silver", "white", "black"]
FOODS = ["bread", "cheese", "apples", "fish", "honey", "wine", "olives", "tea"]


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


@dataclass
class QA:
    id: str
    question: str
    answer: str
    answer_start: int


@dataclass
class Article:
    title: str
    kind: str
    paragraphs: list[str] = field(default_factory=list)
    qas: list[list[QA]] = field(default_factory=list)  # per paragraph


class _Paragraph:
    """Builds a paragraph sentence by sentence, recording where each answer lands."""

    def __init__(self, article: Article, rng: random.Random) -> None:
        self.article, self.rng = article, rng
        self.text = ""
        self.qas: list[QA] = []

    def say(self, template: str, answer: str | None = None, question: str | None = None, **slots: str) -> None:
        """Append one sentence; ``{ans}`` in the template marks the answer, asked by ``question``."""
        sentence = template.format(ans="\x00", **slots)
        start = sentence.find("\x00")
        sentence = sentence.replace("\x00", answer or "")
        prefix = self.text + (" " if self.text else "")
        if answer is not None and question is not None and start >= 0:
            qid = f"{self.article.title.lower()}-{len(self.article.qas)}-{len(self.qas)}"
            self.qas.append(QA(qid, question, answer, len(prefix) + start))
        self.text = prefix + sentence

    def close(self) -> None:
        self.article.paragraphs.append(self.text)
        self.article.qas.append(self.qas)


@dataclass
class GeneratedCorpus:
    """The articles, plus writers for raw text (pretraining) and SQuAD v1.1 JSON (fine-tuning)."""

    articles: list[Article]
    seed: int

    def documents(self) -> list[str]:
        return ["\n".join([a.title, *a.paragraphs]) for a in self.articles]

    def write_text(self, path: str | Path) -> Path:
        """One document per blank-line-separated block (title line, then one paragraph per line)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n\n".join(self.documents()) + "\n", encoding="utf-8")
        return out

    def to_squad(self, articles: list[Article] | None = None) -> dict[str, Any]:
        data = []
        for a in articles if articles is not None else self.articles:
            paragraphs = [{"context": text, "qas": [{"id": q.id, "question": q.question,
                                                     "answers": [{"text": q.answer, "answer_start": q.answer_start}]}
                                                    for q in qas]}
                          for text, qas in zip(a.paragraphs, a.qas) if qas]
            data.append({"title": a.title, "paragraphs": paragraphs})
        return {"version": "1.1", "data": data}

    def write_squad_json(self, path: str | Path, *, articles: list[Article] | None = None) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_squad(articles)), encoding="utf-8")
        return out


def split_articles(articles: list[Article], *, eval_fraction: float = 0.2,
                   seed: int = 0) -> tuple[list[Article], list[Article]]:
    """A reproducible train/eval split by article."""
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(articles) * eval_fraction))
    evaluation = set(order[:n_eval])
    return ([a for i, a in enumerate(articles) if i not in evaluation],
            [a for i, a in enumerate(articles) if i in evaluation])


def _city(a: Article, rng: random.Random, world: dict[str, list[str]], facts: dict[str, Any]) -> None:
    p = _Paragraph(a, rng)
    t = a.title
    p.say(rng.choice(["{t} is a city in the province of {ans}.", "The city of {t} lies in the province of {ans}.",
                      "{t} is located in {ans}, a province known for its {food}."]), facts["province"],
          f"In which province is {t}?", t=t, food=facts["food"])
    p.say(rng.choice(["It was founded in {ans}.", "{t} was founded in the year {ans}.",
                      "Historians date the founding of {t} to {ans}."]), facts["year"],
          f"When was {t} founded?", t=t)
    p.say(rng.choice(["About {ans} people live there.", "{t} has a population of {ans}.",
                      "The census counted {ans} inhabitants in {t}."]), facts["population"],
          f"What is the population of {t}?", t=t)
    p.close()
    p = _Paragraph(a, rng)
    p.say(rng.choice(["The river {ans} flows through {t}.", "{t} stands on the banks of the {ans}.",
                      "The {ans} river crosses the old town of {t}."]), facts["river"],
          f"Which river flows through {t}?", t=t)
    p.say(rng.choice(["The local market is famous for its {ans}.", "Travellers come to {t} for its {ans}.",
                      "{t} trades mostly in {ans}."]), facts["food"], f"What is {t} famous for?", t=t)
    p.say("The flag of {t} is {ans}.", facts["color"], f"What color is the flag of {t}?", t=t)
    p.close()


def _person(a: Article, rng: random.Random, world: dict[str, list[str]], facts: dict[str, Any]) -> None:
    p = _Paragraph(a, rng)
    t = a.title
    aan = "an" if facts["profession"][0] in "aeiou" else "a"
    p.say(rng.choice(["{t} was {aan} {ans} born in {city}.", "{t} worked as {aan} {ans} and was born in {city}.",
                      "Born in {city}, {t} became a well known {ans}."]), facts["profession"],
          f"What was the profession of {t}?", t=t, city=facts["city"], aan=aan)
    p.say(rng.choice(["{t} was born in {ans}.", "The birth of {t} took place in {ans}.",
                      "Records show that {t} was born in the year {ans}."]), facts["year"],
          f"When was {t} born?", t=t)
    p.say(rng.choice(["The family of {t} came from {ans}.", "The family of {t} lived in {ans}.",
                      "{t} grew up in {ans}."]), facts["city"], f"Where was {t} born?", t=t)
    p.close()
    p = _Paragraph(a, rng)
    p.say(rng.choice(["Later {t} joined {ans}.", "{t} spent twenty years working for {ans}.",
                      "In middle age {t} was employed by {ans}."]), facts["company"],
          f"Which company did {t} work for?", t=t)
    p.say(rng.choice(["{t} was known for a love of {ans}.", "Friends remember that {t} always ate {ans}.",
                      "The favourite food of {t} was {ans}."]), facts["food"],
          f"What did {t} love to eat?", t=t)
    p.close()


def _company(a: Article, rng: random.Random, world: dict[str, list[str]], facts: dict[str, Any]) -> None:
    p = _Paragraph(a, rng)
    t = a.title
    p.say(rng.choice(["{t} is a company in the {ans} industry.", "{t} makes its money in {ans}.",
                      "The firm {t} is known for {ans}."]), facts["industry"],
          f"In which industry is {t}?", t=t)
    p.say(rng.choice(["It was founded in {ans}.", "{t} was established in {ans}.",
                      "The company {t} dates from {ans}."]), facts["year"], f"When was {t} founded?", t=t)
    p.say(rng.choice(["Its headquarters are in {ans}.", "{t} is based in {ans}.",
                      "The main office of {t} stands in {ans}."]), facts["city"],
          f"Where is {t} based?", t=t)
    p.close()
    p = _Paragraph(a, rng)
    p.say(rng.choice(["The company was founded by {ans}.", "{ans} founded {t}.",
                      "{t} owes its start to {ans}."]), facts["founder"], f"Who founded {t}?", t=t)
    p.say("{t} employs {ans} people.", facts["population"], f"How many people does {t} employ?", t=t)
    p.close()


def _river(a: Article, rng: random.Random, world: dict[str, list[str]], facts: dict[str, Any]) -> None:
    p = _Paragraph(a, rng)
    t = a.title
    p.say(rng.choice(["The {t} is a river {ans} kilometres long.", "The {t} runs for {ans} kilometres.",
                      "Measured from its source, the {t} is {ans} kilometres long."]), facts["length"],
          f"How long is the {t}?", t=t)
    p.say(rng.choice(["It rises in the province of {ans}.", "Its source lies in {ans}.",
                      "The {t} begins in the hills of {ans}."]), facts["province"],
          f"Where does the {t} rise?", t=t)
    p.say(rng.choice(["It flows into the {ans} sea.", "The {t} ends in the {ans} sea.",
                      "At its mouth the {t} meets the {ans} sea."]), facts["color"],
          f"Into which sea does the {t} flow?", t=t)
    p.close()


WRITERS: dict[str, Callable[[Article, random.Random, dict[str, list[str]], dict[str, Any]], None]] = {
    "city": _city, "person": _person, "company": _company, "river": _river}


def generate_corpus(*, seed: int = 0, num_articles: int = 200) -> GeneratedCorpus:
    """A deterministic encyclopedia of ``num_articles`` entities (a quarter of each kind)."""
    if num_articles < 4:
        raise ValueError(f"num_articles={num_articles} is too small: at least 4 (one entity of each kind)")
    rng = random.Random(seed)
    kinds = list(WRITERS)
    names: dict[str, list[str]] = {k: [] for k in kinds}
    used: set[str] = set()
    plan = []
    for i in range(num_articles):
        kind = kinds[i % len(kinds)]
        while True:
            name = (f"{rng.choice(FIRST_NAMES)} {_name(rng, 2)}" if kind == "person" else _name(rng, rng.randint(2, 3)))
            if name not in used:
                break
        used.add(name)
        names[kind].append(name)
        plan.append((kind, name))
    provinces = [_name(rng, 3) for _ in range(12)]
    articles = []
    for kind, name in plan:
        facts = {"province": rng.choice(provinces), "year": str(rng.randint(1100, 1990)),
                 "population": f"{rng.randint(2, 900)},{rng.randint(0, 999):03d}",
                 "river": rng.choice(names["river"] or [_name(rng, 2)]),
                 "food": rng.choice(FOODS), "color": rng.choice(COLORS), "profession": rng.choice(PROFESSIONS),
                 "city": rng.choice(names["city"] or [_name(rng, 2)]),
                 "company": rng.choice(names["company"] or [_name(rng, 2)]),
                 "industry": rng.choice(INDUSTRIES), "founder": rng.choice(names["person"] or [_name(rng, 2)]),
                 "length": str(rng.randint(40, 3000))}
        article = Article(title=name, kind=kind)
        WRITERS[kind](article, rng, names, facts)
        articles.append(article)
    return GeneratedCorpus(articles=articles, seed=seed)
