"""LangChain 1.x agent with ampkit memory: a LangGraph store and remember/recall tools.

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/langchain_agent.py

Without AMPKIT_URL it uses a fresh SQLite file in process. The model is an offline fake that
follows a script; replace it with any chat model (`init_chat_model("openai:gpt-4o-mini")`).
"""

import os
import tempfile

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage

import ampkit
from fakes.langchain import LangChainFakeModel
from ampkit.adapters.langchain import AmpkitStore, memory_tools

url = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp()}/memory.db"
client = ampkit.connect(url, agent_id="langchain-assistant")

# Turn 1: the model decides to remember what the user said.
model = LangChainFakeModel([
    AIMessage("", tool_calls=[{"name": "remember", "args": {"fact": "Ada's cat is called Tom"}, "id": "1"}]),
    "Noted, Tom it is.",
])
agent = create_agent(model, tools=memory_tools(client, owner_id="ada"), store=AmpkitStore(client, owner_id="ada"))
agent.invoke({"messages": [HumanMessage("My cat is called Tom.")]})

# Turn 2, a new agent: it recalls the fact; the tool result is in the model's next prompt.
model = LangChainFakeModel([
    AIMessage("", tool_calls=[{"name": "recall", "args": {"query": "cat name"}, "id": "2"}]),
    "Your cat is Tom.",
])
agent = create_agent(model, tools=memory_tools(client, owner_id="ada"))
result = agent.invoke({"messages": [HumanMessage("What is my cat called?")]})
print("recall tool returned:", result["messages"][2].content)
print("answer:", result["messages"][-1].content)

# The LangGraph store API works on the same memory.
store = AmpkitStore(client, owner_id="ada")
store.put(("ada", "prefs"), "drink", {"text": "Ada drinks green tea"})
print("store search:", [item.value for item in store.search(("ada",), query="tea")])
client.close()
