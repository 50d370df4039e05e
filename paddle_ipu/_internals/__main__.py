from paddle_ipu._internals import main

raise SystemExit(main())
