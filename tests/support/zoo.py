"""A zoo of tiny transformers (configs built here, nothing downloaded) and a real-text batch for each task.

Every family a kaisa_ds user trains with DeepSpeed: BERT-style encoders, GPT-2's Conv1D, parallel attention + MLP
(GPT-J, Phi, Falcon), grouped- and multi-query attention (Llama, Mistral, Qwen, Gemma, StarCoder2, GPTBigCode),
fused QKV (Phi-3, GPT-NeoX, BLOOM), ALBERT's one layer called per depth, T5 and BART seq2seq, a mixture of experts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from tests.support.bert_data import BERT_VOCAB, WIKITEXT_VALID

VOCAB = 256  # ids of the real-text batch: the most frequent WordPiece tokens of the text, the rest [UNK]
PAD, UNK, MASK, BOS, EOS = 0, 1, 2, 3, 4
HIDDEN, LAYERS, HEADS, FFN = 32, 2, 4, 64


@dataclass(frozen=True)
class Family:
    build: Callable[[], nn.Module]
    task: str  # "mlm", "clm" or "seq2seq"
    unsupported: str = ""  # why fewer than 80% of its linear-like parameters can be preconditioned ("": none)


def _t() -> Any:
    import transformers

    return transformers


def _dec(config: str, model: str, **kw: Any) -> Callable[[], nn.Module]:
    """A decoder-only family at the zoo's size (``kw`` overrides the config's own names)."""
    def build() -> nn.Module:
        t = _t()
        base = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                "intermediate_size": FFN, "max_position_embeddings": 64, "pad_token_id": PAD, "bos_token_id": BOS,
                "eos_token_id": EOS}
        return getattr(t, model)(getattr(t, config)(**{**base, **kw}))
    return build


def _gpt_style(config: str, model: str, **kw: Any) -> Callable[[], nn.Module]:
    """Families that name their sizes GPT-2's way (n_embd, n_layer, n_head)."""
    def build() -> nn.Module:
        t = _t()
        base = {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 64,
                "bos_token_id": BOS, "eos_token_id": EOS}
        return getattr(t, model)(getattr(t, config)(**{**base, **kw}))
    return build


def _enc(config: str, model: str, **kw: Any) -> Callable[[], nn.Module]:
    return _dec(config, model, **{"max_position_embeddings": 64, **kw})


FAMILIES: dict[str, Family] = {
    # encoders (masked LM); their MLM decoders are tied to the word embeddings
    "bert": Family(_enc("BertConfig", "BertForMaskedLM"), "mlm"),
    "roberta": Family(_enc("RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=70), "mlm"),
    "xlm-roberta": Family(_enc("XLMRobertaConfig", "XLMRobertaForMaskedLM", max_position_embeddings=70), "mlm"),
    "deberta-v2": Family(_enc("DebertaV2Config", "DebertaV2ForMaskedLM"), "mlm"),
    "electra": Family(_enc("ElectraConfig", "ElectraForMaskedLM", embedding_size=16), "mlm"),
    "albert": Family(_enc("AlbertConfig", "AlbertForMaskedLM", embedding_size=16), "mlm"),  # one layer, called twice
    "distilbert": Family(lambda: _t().DistilBertForMaskedLM(_t().DistilBertConfig(
        vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, max_position_embeddings=64,
        pad_token_id=PAD)), "mlm"),
    "mobilebert": Family(_enc("MobileBertConfig", "MobileBertForMaskedLM", embedding_size=16, intra_bottleneck_size=16,
                              true_hidden_size=16), "mlm",
                         unsupported="its MLM head multiplies by cls.predictions.dense.weight directly, without "
                                     "calling the module (K-FAC cannot see that layer's inputs)"),
    # decoders
    "gpt2": Family(_gpt_style("GPT2Config", "GPT2LMHeadModel"), "clm"),  # transformers' Conv1D
    "gpt_bigcode": Family(_gpt_style("GPTBigCodeConfig", "GPTBigCodeForCausalLM", multi_query=True), "clm"),  # MQA
    "gptj": Family(_gpt_style("GPTJConfig", "GPTJForCausalLM", rotary_dim=4), "clm"),  # parallel attention + MLP
    "codegen": Family(_gpt_style("CodeGenConfig", "CodeGenForCausalLM", rotary_dim=4), "clm"),
    "gpt_neox": Family(_dec("GPTNeoXConfig", "GPTNeoXForCausalLM"), "clm"),  # fused QKV
    "opt": Family(_dec("OPTConfig", "OPTForCausalLM", ffn_dim=FFN, word_embed_proj_dim=HIDDEN), "clm"),
    "bloom": Family(lambda: _t().BloomForCausalLM(_t().BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                                                    n_layer=LAYERS, n_head=HEADS)), "clm"),
    "falcon": Family(_dec("FalconConfig", "FalconForCausalLM", new_decoder_architecture=False, multi_query=True,
                          parallel_attn=True), "clm"),  # MQA, parallel attention + MLP
    "falcon-new": Family(_dec("FalconConfig", "FalconForCausalLM", new_decoder_architecture=True, num_kv_heads=2),
                         "clm"),
    "llama": Family(_dec("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2), "clm"),  # GQA
    "mistral": Family(_dec("MistralConfig", "MistralForCausalLM", num_key_value_heads=1), "clm"),  # MQA
    "qwen2": Family(_dec("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2), "clm"),
    "qwen3": Family(_dec("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=8), "clm"),
    "gemma": Family(_dec("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=8), "clm"),
    "gemma2": Family(_dec("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=8), "clm"),
    "phi": Family(_dec("PhiConfig", "PhiForCausalLM"), "clm"),  # parallel attention + MLP
    "phi3": Family(_dec("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2), "clm"),  # fused QKV
    "starcoder2": Family(_dec("Starcoder2Config", "Starcoder2ForCausalLM", num_key_value_heads=2), "clm"),
    "stablelm": Family(_dec("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2), "clm"),
    "olmo": Family(_dec("OlmoConfig", "OlmoForCausalLM"), "clm"),
    "mpt": Family(lambda: _t().MptForCausalLM(_t().MptConfig(vocab_size=VOCAB, d_model=HIDDEN, n_layers=LAYERS,
                                                              n_heads=HEADS, max_seq_len=64)), "clm"),
    "cohere": Family(_dec("CohereConfig", "CohereForCausalLM", num_key_value_heads=2, logit_scale=1.0), "clm"),
    "mixtral": Family(_dec("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2), "clm",
                      unsupported="its experts are fused 3-D parameters (MixtralExperts), not modules K-FAC knows"),
    # seq2seq
    "t5": Family(lambda: _t().T5ForConditionalGeneration(_t().T5Config(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS, pad_token_id=PAD,
        decoder_start_token_id=PAD, eos_token_id=EOS)), "seq2seq"),
    "bart": Family(lambda: _t().BartForConditionalGeneration(_t().BartConfig(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS)), "seq2seq"),
}


@lru_cache(maxsize=1)
def text_ids(tokens: int = 20_000) -> torch.Tensor:
    """The first ``tokens`` WordPiece tokens of WikiText-2 valid (BERT's uncased vocabulary), mapped onto the zoo's
    :data:`VOCAB` ids: the most frequent ones keep an id of their own, the rest are [UNK]."""
    from bert_pretrain.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(BERT_VOCAB, lower_case=True)
    ids: list[int] = []
    for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("="):
            ids += tokenizer(line, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            break
    frequent = [t for t, _ in Counter(ids).most_common(VOCAB - EOS - 1)]
    table = {t: i + EOS + 1 for i, t in enumerate(frequent)}
    return torch.tensor([table.get(t, UNK) for t in ids[:tokens]])


def batch(task: str, *, size: int = 8, seq: int = 32, offset: int = 0) -> dict[str, torch.Tensor]:
    """A real-text batch for ``task``: ``size`` consecutive blocks of ``seq`` tokens (from ``offset`` blocks in)."""
    ids = text_ids()
    blocks = ids[offset * seq:(offset + 2 * size) * seq].reshape(2 * size, seq)
    if task == "clm":
        return {"input_ids": blocks[:size], "labels": blocks[:size]}
    if task == "seq2seq":  # the next block from this one
        return {"input_ids": blocks[:size], "labels": blocks[size:]}
    g = torch.Generator().manual_seed(offset)
    masked = torch.rand(size, seq, generator=g) < 0.15
    inputs = blocks[:size].clone()
    inputs[masked] = MASK
    return {"input_ids": inputs, "labels": torch.where(masked, blocks[:size], torch.full_like(inputs, -100))}
