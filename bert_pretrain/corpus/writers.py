"""Articles from the world's facts: several templates per sentence and per question, cross references.

The answer's character offset is recorded while the sentence is written, so ``context[answer_start:]`` starts
with the answer by construction. Paragraphs that only cross-reference other articles carry no questions.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from bert_pretrain.corpus.records import QA, Article
from bert_pretrain.corpus.relations import relations_paragraph
from bert_pretrain.corpus.world import Entity

ANSWER = "\x00"  # placeholder for the answer while a template is filled


class _Paragraph:
    """Builds one paragraph sentence by sentence, recording where each answer lands."""

    def __init__(self, article: Article, rng: random.Random, slots: dict[str, str]) -> None:
        self.article, self.rng, self.slots = article, rng, slots
        self.text = ""
        self.qas: list[QA] = []

    def say(self, templates: list[str], answer: str | None = None, questions: list[str] | None = None) -> None:
        """Append one sentence from a random template; ``{ans}`` marks the answer that ``questions`` ask for."""
        sentence = self.rng.choice(templates).format(ans=ANSWER, **self.slots)
        sentence = sentence[0].upper() + sentence[1:]
        start = sentence.find(ANSWER)
        sentence = sentence.replace(ANSWER, answer or "")
        prefix = self.text + (" " if self.text else "")
        if answer is not None and questions and start >= 0:
            slug = "-".join(self.article.title.lower().split())
            qid = f"{slug}-{len(self.article.paragraphs)}-{len(self.qas)}"
            question = self.rng.choice(questions).format(**self.slots)
            self.qas.append(QA(qid, question[0].upper() + question[1:], answer, len(prefix) + start))
        self.text = prefix + sentence

    def close(self) -> None:
        if self.text:
            self.article.paragraphs.append(self.text)
            self.article.qas.append(self.qas)


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _city(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    if "capital_of" in f:
        p.say(["{t} is the capital of {ans}.", "{ans} has {t} as its capital.", "{t} is the capital city of {ans}."],
              f["capital_of"], ["Of which country is {t} the capital?", "{t} is the capital of which country?"])
    else:
        p.say(["{t} is a city in {ans}.", "The city of {t} lies in {ans}.", "{t} is one of the cities of {ans}."],
              f["country"], ["In which country is {t}?", "Which country is {t} located in?"])
    p.say(["It was founded in {ans}.", "{t} was founded in the year {ans}.",
           "Historians date the founding of {t} to {ans}."], f["year"], ["When was {t} founded?",
                                                                        "In what year was {t} founded?"])
    p.say(["About {ans} people live there.", "{t} has a population of {ans}.",
           "The last census counted {ans} inhabitants in {t}."], f["population"],
          ["What is the population of {t}?", "How many people live in {t}?"])
    p.close()
    p = new()
    p.say(["The {ans} flows through {t}.", "{t} stands on the banks of the {ans}.",
           "The {ans} river crosses the old town of {t}."], f["river"],
          ["Which river flows through {t}?", "On which river does {t} stand?"])
    p.say(["The local market is famous for its {ans}.", "Travellers come to {t} for its {ans}.",
           "{t} trades mostly in {ans}."], f["food"], ["What is {t} famous for?", "What does {t} trade in?"])
    p.say(["The flag of {t} is {ans}.", "{t} flies a {ans} flag.", "The city flag of {t} is {ans}."], f["color"],
          ["What color is the flag of {t}?", "Which colour is the flag of {t}?"])
    p.close()
    p = new()
    if people := e.mentions.get("people", [])[:3]:
        p.say([f"Notable people born in {{t}} include {_listing(people)}.",
               f"{_listing(people)} grew up in {{t}}."])
    for company in e.mentions.get("companies", [])[:2]:
        p.say([f"{company} has its headquarters in {{t}}.", f"The {w[company].facts['industry']} firm {company} "
               "is based in {t}."])
    for uni in e.mentions.get("universities", [])[:2]:
        p.say([f"{uni} is located in {{t}}.", f"The city is home to {uni}, founded in {w[uni].facts['year']}."])
    p.close()


def _person(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    p.say(["{t} was {aan} {ans} born in {city}.", "{t} worked as {aan} {ans}.",
           "Born in {city}, {t} became a well known {ans}."], f["profession"],
          ["What was the profession of {t}?", "What did {t} work as?"])
    p.say(["{t} was born in {ans}.", "The birth of {t} took place in {ans}.",
           "Records show that {t} was born in the year {ans}."], f["year"],
          ["When was {t} born?", "In what year was {t} born?"])
    p.say(["{t} grew up in {ans}, a city in {country}.", "The family of {t} lived in {ans}.",
           "{t} spent a childhood in {ans}."], f["city"], ["Where did {t} grow up?", "In which city did {t} grow up?"])
    p.close()
    p = new()
    p.say(["{t} studied {subject} at {ans}.", "{t} was educated at {ans}.", "After school {t} went to {ans}."],
          f["university"], ["Where did {t} study?", "Which university did {t} attend?"])
    if founded := e.mentions.get("founded"):
        p.say(["In {cyear} {t} founded {ans}.", "{t} later founded {ans}.", "{t} started the company {ans}."],
              founded[0], ["Which company did {t} found?", "What company was founded by {t}?"])
    else:
        p.say(["Later {t} joined {ans}.", "{t} spent twenty years working for {ans}.",
               "In middle age {t} was employed by {ans}."], f["employer"],
              ["Which company did {t} work for?", "Who employed {t}?"])
    p.say(["{t} was known for a love of {food}.", "Friends remember that {t} always ate {food}.",
           "The favourite food of {t} was {food}."])
    p.close()
    p = new()
    if "died" in f:
        p.say(["{t} died in {died}.", "{t} died in {died} in {city}.",
               "The death of {t} in {died} was mourned in {city}."])
    else:
        p.say(["{t} still lives in {city}.", "Today {t} lives in {city} again."])
    p.say(["{city} lies on the {river}.", "{city} is a city on the {river} in {country}."])
    p.close()


def _company(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    p.say(["{t} is a company in the {ans} industry.", "{t} makes its money in {ans}.",
           "The firm {t} is known for {ans}."], f["industry"], ["In which industry is {t}?", "What does {t} do?"])
    p.say(["It was founded in {ans}.", "{t} was established in {ans}.", "The company {t} dates from {ans}."],
          f["year"], ["When was {t} founded?", "In what year was {t} established?"])
    p.say(["Its headquarters are in {ans}.", "{t} is based in {ans}.", "The main office of {t} stands in {ans}."],
          f["city"], ["Where is {t} based?", "Where are the headquarters of {t}?"])
    p.close()
    p = new()
    p.say(["The company was founded by {ans}.", "{ans} founded {t}.", "{t} owes its start to {ans}."], f["founder"],
          ["Who founded {t}?", "Who started {t}?"])
    p.say(["{t} employs {ans} people.", "The firm has {ans} employees."], f["employees"],
          ["How many people does {t} employ?", "How many employees does {t} have?"])
    p.say(["Its founder, {founder}, was born in {fcity}.", "{founder} came from {fcity}."])
    p.close()


def _river(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    p.say(["The {t} is a river {ans} kilometres long.", "The {t} runs for {ans} kilometres.",
           "Measured from its source, the {t} is {ans} kilometres long."], f["length"],
          ["How long is the {t}?", "How many kilometres long is the {t}?"])
    p.say(["It rises in {ans}.", "Its source lies in {ans}.", "The {t} begins in the hills of {ans}."],
          f["source"], ["Where does the {t} rise?", "In which country is the source of the {t}?"])
    p.say(["It flows into the {ans} Sea.", "The {t} ends in the {ans} Sea.",
           "At its mouth the {t} meets the {ans} Sea."], f["sea"],
          ["Into which sea does the {t} flow?", "Where does the {t} end?"])
    p.close()
    if cities := e.mentions.get("cities", [])[:4]:
        p = new()
        p.say([f"Cities on the {{t}} include {_listing(cities)}.", f"The {{t}} passes {_listing(cities)}."])
        p.say([f"{cities[0]} was founded on its banks in {w[cities[0]].facts['year']}."])
        p.close()


def _country(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    p.say(["{t} is a country whose capital is {ans}.", "The capital of {t} is {ans}.", "{ans} is the capital of {t}."],
          f["capital"], ["What is the capital of {t}?", "Which city is the capital of {t}?"])
    p.say(["{t} became independent in {ans}.", "The state of {t} was formed in {ans}."], f["year"],
          ["When did {t} become independent?", "In what year was {t} formed?"])
    p.say(["It has a population of {ans}.", "{ans} people live in {t}."], f["population"],
          ["What is the population of {t}?", "How many people live in {t}?"])
    p.close()
    p = new()
    p.say(["The national flag is {ans}.", "{t} has a {ans} flag."], f["color"], ["What color is the flag of {t}?"])
    p.say(["The country exports {ans}.", "{t} is known abroad for its {ans}."], f["food"],
          ["What does {t} export?", "What is {t} known for abroad?"])
    others = [c for c in e.mentions.get("cities", []) if c != f["capital"]][:3]
    if others:
        p.say([f"Other cities of {{t}} include {_listing(others)}.",
               f"Besides the capital, {{t}} has {_listing(others)}."])
    p.close()


def _university(e: Entity, w: dict[str, Entity], new: Callable[[], _Paragraph]) -> None:
    f = e.facts
    p = new()
    p.say(["{t} is a university in {ans}.", "{t} stands in the city of {ans}.", "The campus of {t} is in {ans}."],
          f["city"], ["Where is {t}?", "In which city is {t}?"])
    p.say(["It was founded in {ans}.", "{t} opened in {ans}."], f["year"], ["When was {t} founded?"])
    p.say(["It is best known for {ans}.", "Its school of {ans} is famous."], f["subject"],
          ["What is {t} known for?", "Which subject is {t} famous for?"])
    p.close()
    p = new()
    p.say(["{t} has {ans} students.", "About {ans} students attend {t}."], f["students"],
          ["How many students does {t} have?"])
    if alumni := e.mentions.get("people", [])[:3]:
        p.say([f"Its former students include {_listing(alumni)}.", f"{_listing(alumni)} studied there."])
    p.close()


WRITERS: dict[str, Callable[[Entity, dict[str, Entity], Callable[[], _Paragraph]], None]] = {
    "city": _city, "person": _person, "company": _company, "river": _river, "country": _country,
    "university": _university}


def _slots(e: Entity, w: dict[str, Entity]) -> dict[str, str]:
    """Template slots: the title and the facts, plus a few facts of referenced entities."""
    slots = {"t": e.name, **e.facts}
    if "city" in e.facts:
        city = w[e.facts["city"]]
        slots.update(country=city.facts["country"], river=city.facts["river"])
    if "founder" in e.facts:
        slots["fcity"] = w[e.facts["founder"]].facts["city"]
    if "university" in e.facts:
        slots["subject"] = w[e.facts["university"]].facts["subject"]
    if founded := e.mentions.get("founded"):
        slots["cyear"] = w[founded[0]].facts["year"]
    if "profession" in e.facts:
        slots["aan"] = "an" if e.facts["profession"][0] in "aeiou" else "a"
    return slots


def write_article(entity: Entity, world: dict[str, Entity], rng: random.Random) -> Article:
    article = Article(title=entity.name, kind=entity.kind)
    slots = _slots(entity, world)
    WRITERS[entity.kind](entity, world, lambda: _Paragraph(article, rng, slots))
    if text := relations_paragraph(entity, world, rng):
        article.paragraphs.append(text)
        article.qas.append([])
    return article
