"""Does the model's tokenizer read the SQuAD text? The [UNK] share of a file's contexts and questions.

The count and the limit are ``bert_pretrain.data.tokenizer``'s (one home for tokenizer checks): a tokenizer that
loads fine can still turn every word into [UNK] (a 5-token vocabulary, another language's), and fine-tuning on
that finishes with rc 0 and learns nothing. Refused before any training, naming the file and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import datasets

from bert_pretrain.data.tokenizer import check_coverage, count_unknown

logger = logging.getLogger(__name__)


def check_unk_share(tokenizer: Any, examples: datasets.Dataset, *, data: Path, source: str,
                    max_unk_rate: float) -> float:
    """The [UNK] share of ``examples``' distinct contexts and their questions; a DataError above ``max_unk_rate``."""
    texts = [*dict.fromkeys(examples["context"]), *examples["question"]]
    unknown, total = count_unknown(tokenizer, texts)
    share = check_coverage(unknown=unknown, total=total, data=str(data), source=source, max_unk_rate=max_unk_rate,
                           rate_flag="--max-unk-rate")
    logger.info("%s: %.2f%% of %d tokens are [UNK] with %s", data, 100 * share, total, source)
    return share
