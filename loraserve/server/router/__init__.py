"""Router mode: several models and presets behind one server, as llama-server's router
(`--models-dir`, `--models-preset`, `--models-max`, `--[no-]models-autoload`): the catalogue
(`presets`), the in-process engines (`pool`) and the HTTP routes (`app`). Presets over one
base file share one engine."""
