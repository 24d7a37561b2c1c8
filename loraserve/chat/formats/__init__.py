"""Chat formats: how a template's assistant turns spell reasoning, content and tool calls
(`ChatFormat`), found as llama-server finds them (`detect`: specialised detectors, then the
differential analyser), and what reads and constrains them: `ChatParser` / `MessageStream`
(whole and streamed parsing) and `tool_grammar` (llguidance grammars for tool_choice)."""
