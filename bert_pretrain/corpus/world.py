"""A consistent generated world: countries, cities, rivers, people, companies and universities with facts.

Every fact is drawn once and shared: the article about a city and the article about a person born there
state the same city, country and river, so what a model reads in one article helps in another. Only
``random.Random(seed)`` is used, and nothing iterates over a set, so a seed always gives the same world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vor", "sel", "an", "du", "bri", "nel", "os", "tar", "ul", "gen",
             "pa", "zi", "hol", "mer", "quin", "ba", "ce", "fi", "ju", "ros", "wen", "yl", "dor", "ith", "ma"]
FIRST_NAMES = ["Alma", "Bruno", "Clara", "Dario", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Karin",
               "Leon", "Mira", "Nils", "Olga", "Paul", "Rosa", "Stefan", "Tilda", "Victor", "Wanda", "Yusuf"]
COUNTRY_ENDINGS = ["ia", "land", "mark", "ora", "stan"]
COMPANY_ENDINGS = ["Works", "Group", "Trading", "Industries", "Company", "Holdings"]
UNIVERSITY_FORMS = ["{} University", "{} Institute", "{} College", "{} Academy"]
PROFESSIONS = ["painter", "physicist", "architect", "composer", "novelist", "chemist", "sculptor", "engineer",
               "astronomer", "poet", "botanist", "cartographer"]
INDUSTRIES = ["shipbuilding", "textiles", "software", "mining", "publishing", "brewing", "aviation", "glassmaking",
              "pharmaceuticals", "railways"]
SUBJECTS = ["medicine", "law", "mathematics", "music", "agriculture", "astronomy", "history", "engineering"]
COLORS = ["red", "blue", "green", "golden", "silver", "white", "black"]
FOODS = ["bread", "cheese", "apples", "fish", "honey", "wine", "olives", "tea"]
SEAS = ["Northern", "Eastern", "Western", "Southern", "Inner", "Amber"]

# share of the articles per kind (cities get at least one per country: each country has a capital)
SHARES = {"country": 0.06, "river": 0.10, "university": 0.08, "company": 0.16, "city": 0.25}
KINDS = ["country", "city", "river", "person", "company", "university"]
MIN_ARTICLES = len(KINDS) + 1
LAST_YEAR = 2020  # people born late enough are still alive


@dataclass
class Entity:
    """One named thing; ``facts`` are strings as written in the text, references are other entities' names."""

    name: str
    kind: str
    facts: dict[str, str] = field(default_factory=dict)
    mentions: dict[str, list[str]] = field(default_factory=dict)  # reverse references, e.g. people born here


class _Names:
    """Unique names from syllables (``random`` draws, uniqueness checked against all names so far)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def fresh(self, make: str) -> str:
        rng = self.rng
        while True:
            stem = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
            if make == "person":
                name = f"{rng.choice(FIRST_NAMES)} {stem}"
            elif make == "country":
                stem = "".join(rng.choice(SYLLABLES) for _ in range(2)).capitalize()
                ending = rng.choice(COUNTRY_ENDINGS)
                name = stem + (ending if stem[-1] not in "aeiouy" or ending[0] not in "aeiou" else "land")
            elif make == "company":
                name = f"{stem} {rng.choice(COMPANY_ENDINGS)}"
            elif make == "university":
                name = rng.choice(UNIVERSITY_FORMS).format(stem)
            else:
                name = stem
            if name not in self.used:
                self.used.add(name)
                return name


def article_counts(num_articles: int) -> dict[str, int]:
    """How many entities of each kind; people take what the other kinds leave."""
    if num_articles < MIN_ARTICLES:
        raise ValueError(f"num_articles={num_articles} is too small: at least {MIN_ARTICLES} (one entity of each "
                         f"kind: {', '.join(KINDS)})")
    counts = {kind: max(1, round(num_articles * share)) for kind, share in SHARES.items()}
    counts["city"] = max(counts["city"], counts["country"])
    counts["person"] = num_articles - sum(counts.values())
    if counts["person"] < 1:  # only for the smallest worlds
        counts["city"] -= 1 - counts["person"]
        counts["person"] = 1
    return counts


def _year(rng: random.Random, low: int, high: int) -> str:
    return str(rng.randint(low, high))


def _count(rng: random.Random, low: int, high: int) -> str:
    """A number written with a thousands separator, as the text and the answers show it."""
    return f"{rng.randint(low, high):,}"


def build_world(rng: random.Random, num_articles: int) -> list[Entity]:
    """All entities, facts drawn once; returned in a shuffled article order."""
    counts = article_counts(num_articles)
    names = _Names(rng)
    by_kind: dict[str, list[Entity]] = {k: [Entity(names.fresh(k), k) for _ in range(counts[k])] for k in KINDS}
    countries, cities, rivers = by_kind["country"], by_kind["city"], by_kind["river"]
    for i, country in enumerate(countries):
        capital = cities[i]
        country.facts.update(capital=capital.name, year=_year(rng, 1200, 1950), color=rng.choice(COLORS),
                             population=_count(rng, 800_000, 60_000_000), food=rng.choice(FOODS))
        capital.facts["capital_of"] = country.name
    for river in rivers:
        source = rng.choice(countries)
        river.facts.update(length=str(rng.randint(40, 3000)), source=source.name, sea=rng.choice(SEAS))
        source.mentions.setdefault("rivers", []).append(river.name)
    for city in cities:
        river = rng.choice(rivers)
        country = next((c for c in countries if c.name == city.facts.get("capital_of")), None) or rng.choice(countries)
        city.facts.update(country=country.name, year=_year(rng, 900, 1900), population=_count(rng, 2_000, 900_000),
                          river=river.name, food=rng.choice(FOODS), color=rng.choice(COLORS))
        river.mentions.setdefault("cities", []).append(city.name)
        country.mentions.setdefault("cities", []).append(city.name)
    for uni in by_kind["university"]:
        city = rng.choice(cities)
        uni.facts.update(city=city.name, year=_year(rng, 1100, 1950), subject=rng.choice(SUBJECTS),
                         students=_count(rng, 800, 60_000))
        city.mentions.setdefault("universities", []).append(uni.name)
    for person in by_kind["person"]:
        city, uni = rng.choice(cities), rng.choice(by_kind["university"])
        born, age = rng.randint(1700, 1960), rng.randint(35, 95)
        person.facts.update(city=city.name, year=str(born), profession=rng.choice(PROFESSIONS), university=uni.name,
                            food=rng.choice(FOODS))
        if born + age <= LAST_YEAR:
            person.facts["died"] = str(born + age)
        city.mentions.setdefault("people", []).append(person.name)
        uni.mentions.setdefault("people", []).append(person.name)
    people = by_kind["person"]
    for company in by_kind["company"]:
        city, founder = rng.choice(cities), rng.choice(people)
        company.facts.update(city=city.name, founder=founder.name, industry=rng.choice(INDUSTRIES),
                             year=str(int(founder.facts["year"]) + rng.randint(20, 40)),
                             employees=_count(rng, 40, 90_000))
        city.mentions.setdefault("companies", []).append(company.name)
        founder.mentions.setdefault("founded", []).append(company.name)
    for person in people:
        if "founded" not in person.mentions:
            employer = rng.choice(by_kind["company"])
            person.facts["employer"] = employer.name
            employer.mentions.setdefault("staff", []).append(person.name)
    entities = [e for k in KINDS for e in by_kind[k]]
    rng.shuffle(entities)
    return entities
