"""Router mode: several models and presets behind one server, as llama-server's router
(`--models-dir`, `--models-preset`, `--models-max`, `--[no-]models-autoload`): the catalogue
(`presets`), the engines (`engine`, `pool`), each base file's in a child process (`host`,
`hosts`), and the HTTP routes (`app`). Presets over one base file share one engine."""
