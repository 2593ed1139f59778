"""Agents written with any framework: the OpenAI-compatible chat endpoint that records what it sampled, token for token (chat.py, chat_request.py)."""
