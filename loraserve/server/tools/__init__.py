"""Built-in tools and the MCP client for agents (llama-server's `--tools`, `--mcp-servers-*`,
`/tools`, `/cors-proxy`): the seven built-in tools confined to one root directory
(`confine`, `files`, `search`, `shell`, `listing`, `edits`), tool runtimes parsed and refused
(`runtime`), stdio MCP servers (`mcp_config`, `mcp`, `mcp_manager`, `procs`), and the routes
(`routes`, `proxy`). Flags: `server/config/tools_flags.py`."""
