"""SQuAD v1.1 fine-tuning and evaluation of a BERT checkpoint (question answering by span extraction).

``python -m squad_finetune --help`` trains and evaluates; ``python -m squad_finetune.evaluate DATASET PREDICTIONS``
is the official metric script. Importing the package is cheap: torch, transformers and DeepSpeed load on demand.
"""

__all__: list[str] = []
