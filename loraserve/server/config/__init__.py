"""The command line: every flag is registered here (`args.build_parser`), parsed into the frozen
`ServerConfig` the server reads; feature modules only read the config."""
