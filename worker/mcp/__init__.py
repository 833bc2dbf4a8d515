"""MCP both ways.

* ``config``: what an agent's MCP server is (``--mcp NAME=URL`` / ``NAME=stdio:COMMAND``), the
  names its tools get (``NAME__tool``) and their scope (``mcp:NAME``). No SDK import: the
  command line and the settings checks use it.
* ``sources``: MCP servers as tool sources of a mission (an SDK client session per iteration);
  ``translate`` turns their tools into ``ToolSpec``s and their results into what agents read.
  What the servers send is read within limits (``wire``), by mana-ai's stdio transport
  (``stdio``) or under the SDK's HTTP client (``http_transport``), and ``guard`` stands
  between the transport and the SDK (replies it would drop, tools it would refuse).
* ``consumer``: the MCP server's call path: the built-in ``ToolSpec``s behind the same policy
  gate as a mission's calls, recorded in ``tool_invocations`` (consumer ``mcp``).
* ``server``: ``mana-ai mcp serve`` (streamable HTTP with bearer tokens, or stdio).
"""
