from benchmarks.gpu.cli import main

raise SystemExit(main())
