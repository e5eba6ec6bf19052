"""The agent loop: tools, sandboxed workspace, chat rendering with token masks, episodes."""
