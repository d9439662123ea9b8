"""``python -m bert_pretrain``: see bert_pretrain/cli.py."""

from bert_pretrain.train import main

raise SystemExit(main())
