"""The built-in corpus: answers at their offsets, determinism, consistent cross references, SQuAD JSON, split."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from bert_pretrain.corpus import MIN_ARTICLES, generate_corpus, split_articles


def test_every_answer_starts_at_its_offset_in_the_squad_json(tmp_path: Path) -> None:
    corpus = generate_corpus(seed=3, num_articles=60)
    data = json.loads(corpus.write_squad_json(tmp_path / "all.json").read_text())
    assert data["version"] == "1.1" and len(data["data"]) == 60
    ids = []
    for article in data["data"]:
        assert article["title"] and article["paragraphs"]
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                ids.append(qa["id"])
                assert qa["question"].endswith("?")
                (answer,) = qa["answers"]
                assert context[answer["answer_start"]:].startswith(answer["text"]), (context, answer)
                assert answer["text"] not in qa["question"]  # the question does not give the answer away
    assert len(ids) == len(set(ids)) >= 60 * 3


def test_deterministic_from_the_seed_and_varied_across_seeds(tmp_path: Path) -> None:
    a = generate_corpus(seed=1, num_articles=30).write_text(tmp_path / "a.txt").read_text()
    b = generate_corpus(seed=1, num_articles=30).write_text(tmp_path / "b.txt").read_text()
    c = generate_corpus(seed=2, num_articles=30).write_text(tmp_path / "c.txt").read_text()
    assert a == b and a != c
    blocks = a.strip().split("\n\n")
    assert len(blocks) == 30  # one blank-line-separated document per article
    assert min(len(block.splitlines()) for block in blocks) >= 3  # a title and at least two paragraphs


def test_kinds_templates_and_length() -> None:
    corpus = generate_corpus(seed=0, num_articles=200)
    kinds = Counter(a.kind for a in corpus.articles)
    assert set(kinds) == {"person", "city", "company", "river", "country", "university"}
    assert kinds["person"] == max(kinds.values())
    # several templates per fact: the founding year of cities is worded in more than one way
    wordings = {re.sub(r"\d{3,4}", "<year>", s.replace(a.title, "<t>"))
                for a in corpus.articles if a.kind == "city" for s in a.paragraphs[0].split(". ") if "found" in s}
    assert len(wordings) >= 3
    words = sum(len(d.split()) for d in corpus.documents())
    assert 60 * 200 < words < 150 * 200  # documents long enough to pair sentences, short enough to stay cheap


def test_cross_references_agree_with_the_referenced_article() -> None:
    """Facts restated in another article are the referenced article's own: people a city's article names grew
    up there by their own articles, and a person's article gives their city's country as the city's does."""
    corpus = generate_corpus(seed=5, num_articles=120)
    by_title = {a.title: a for a in corpus.articles}
    people = [a for a in corpus.articles if a.kind == "person"]
    grew_up = {a.title: next(q.answer for q in a.questions() if "grow up" in q.question) for a in people}
    named = 0
    for city in (a for a in corpus.articles if a.kind == "city"):
        for sentence in " ".join(city.paragraphs).split(". "):
            listed = re.fullmatch(rf"(?:Notable people born in {city.title} include (.+)|(.+) grew up in {city.title})",
                                  sentence.rstrip("."))
            if listed:
                for name in re.split(r", | and ", listed.group(1) or listed.group(2)):
                    assert grew_up[name] == city.title, (name, city.title)
                    named += 1
    countries = 0
    for person in people:
        city = by_title[grew_up[person.title]]
        country = next(q.answer for q in city.questions() if "country" in q.question)
        text = " ".join(person.paragraphs)
        assert city.title in text
        for match in re.finditer(rf"{city.title} (?:lies in|is a city on the \w+ in) (\w+)", text):
            assert match.group(1) == country
            countries += 1
    assert named > 20 and countries > 10


def test_split_by_article() -> None:
    corpus = generate_corpus(seed=0, num_articles=20)
    train, evaluation = split_articles(corpus.articles, eval_fraction=0.25, seed=0)
    assert len(train) == 15 and len(evaluation) == 5
    assert not {a.title for a in train} & {a.title for a in evaluation}
    assert split_articles(corpus.articles, eval_fraction=0.25, seed=0)[1] == evaluation
    with pytest.raises(ValueError, match="eval_fraction"):
        split_articles(corpus.articles, eval_fraction=1.5)


def test_too_few_articles_is_refused() -> None:
    generate_corpus(num_articles=MIN_ARTICLES)
    with pytest.raises(ValueError, match="num_articles"):
        generate_corpus(num_articles=MIN_ARTICLES - 1)
