from paddle_ipu.cli import main

raise SystemExit(main())
