"""Cross references: a closing paragraph of every article restates facts of the entities it is linked to.

The same fact then appears in several articles, worded differently, which is what lets a small masked LM
learn facts (not only the templates) and gives the pretraining text longer documents.
"""

from __future__ import annotations

import random

from bert_pretrain.corpus.world import Entity

ABOUT = {
    "person": ["{n} was {aan} {profession} born in {city} in {year}.", "The {profession} {n} was born in {year}.",
               "{n}, born in {year}, worked as {aan} {profession}."],
    "city": ["{n} is a city of {country} on the {river}.", "{n}, founded in {year}, has {population} inhabitants.",
             "{n} lies in {country} and was founded in {year}."],
    "company": ["{n} is a {industry} company founded in {year} by {founder}.",
                "{n}, based in {city}, works in {industry}.", "{n} was founded in {city} in {year}."],
    "river": ["The {n} is {length} kilometres long and flows into the {sea} Sea.", "The {n} rises in {source}.",
              "The {n} runs for {length} kilometres from {source} to the {sea} Sea."],
    "country": ["{n} is a country whose capital is {capital}.", "{n} became independent in {year}.",
                "{capital} is the capital of {n}, a country of {population} people."],
    "university": ["{n} in {city} was founded in {year}.", "{n} is known for {subject}.",
                   "{n} teaches {subject} to {students} students in {city}."],
}
# (fact or mention key, how many) of the entities an article of each kind refers to
LINKS = {
    "person": [("city", 1), ("university", 1), ("employer", 1), ("founded", 1)],
    "city": [("country", 1), ("river", 1), ("people", 3), ("companies", 2), ("universities", 2)],
    "company": [("city", 1), ("founder", 1), ("staff", 2)],
    "river": [("source", 1), ("cities", 3)],
    "country": [("capital", 1), ("cities", 2), ("rivers", 2)],
    "university": [("city", 1), ("people", 3)],
}


def about(entity: Entity, rng: random.Random) -> str:
    """One sentence of facts about ``entity``, from a random template of its kind."""
    slots = {"n": entity.name, **entity.facts}
    if "profession" in entity.facts:
        slots["aan"] = "an" if entity.facts["profession"][0] in "aeiou" else "a"
    sentence = rng.choice(ABOUT[entity.kind]).format(**slots)
    return sentence[0].upper() + sentence[1:]


def linked(entity: Entity) -> list[str]:
    """Names of the entities ``entity``'s article refers to, in a fixed order, without repeats."""
    names: list[str] = []
    for key, count in LINKS[entity.kind]:
        found = [entity.facts[key]] if key in entity.facts else entity.mentions.get(key, [])[:count]
        names.extend(n for n in found if n not in names and n != entity.name)
    return names


def relations_paragraph(entity: Entity, world: dict[str, Entity], rng: random.Random) -> str:
    return " ".join(about(world[name], rng) for name in linked(entity))
