"""Raw text → documents → sentences: blank-line blocks, whole files, WikiText headings, and bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bert_pretrain.data.documents import DataError, read_documents, split_sentences


def test_blank_line_blocks_and_sentences(tmp_path: Path) -> None:
    f = tmp_path / "plain.txt"
    f.write_text("First sentence here. Second one! Is it 3 now? \"Quoted\" start.\nNext line.\n\n\n"
                 "Second document. Ends here\n\n   \nThird.\n")
    assert read_documents([f]) == [["First sentence here.", "Second one!", "Is it 3 now?", "\"Quoted\" start.",
                                    "Next line."], ["Second document.", "Ends here"], ["Third."]]
    assert read_documents([f], split="files") == [["First sentence here.", "Second one!", "Is it 3 now?",
                                                    "\"Quoted\" start.", "Next line.", "Second document.",
                                                    "Ends here", "Third."]]


def test_several_files_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Alpha one. Alpha two.\n")
    b.write_text("Beta one.\n\nBeta two.\n")
    assert read_documents([a, b]) == [["Alpha one.", "Alpha two."], ["Beta one."], ["Beta two."]]
    assert read_documents([b, a], split="files") == [["Beta one.", "Beta two."], ["Alpha one.", "Alpha two."]]


def test_wikitext_headings_start_documents_and_marks_are_undone(tmp_path: Path) -> None:
    f = tmp_path / "wiki.txt"
    f.write_text(" \n = Robert Boulter = \n \n Robert Boulter is an English film @-@ actor . He was born in "
                 "1 @,@ 000 places .\n \n A second paragraph of the lead .\n \n = = Career = = \n \n"
                 " = = = 2000 – 2005 = = = \n \n In 2000 Boulter had a role .\n")
    docs = read_documents([f])
    assert docs == [["Robert Boulter is an English film-actor .", "He was born in 1,000 places .",
                     "A second paragraph of the lead ."], ["In 2000 Boulter had a role ."]]


def test_sentences_end_before_a_capital_or_digit_only() -> None:
    assert split_sentences(" In town. then lowercase? Next One. 1900 was a year!  ") == [
        "In town. then lowercase?", "Next One.", "1900 was a year!"]


def test_missing_empty_and_bad_options_name_the_file_or_flag(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"--data: .*missing\.txt does not exist"):
        read_documents([tmp_path / "missing.txt"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(DataError, match=r"--data: .*empty\.txt is empty"):
        read_documents([empty])
    with pytest.raises(DataError, match="no input files"):
        read_documents([])
    with pytest.raises(DataError, match="--doc-split"):
        read_documents([empty], split="lines")
