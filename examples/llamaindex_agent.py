"""LlamaIndex FunctionAgent with ampkit memory (the whole `BaseMemory`, or one block).

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/llamaindex_agent.py

Without AMPKIT_URL it uses a fresh SQLite file in process. The LLM is an offline fake that
records its prompts; replace it with any LlamaIndex LLM.
"""

import asyncio
import os
import tempfile

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import Memory

import ampkit
from fakes.llamaindex import LlamaIndexFakeLLM
from ampkit.adapters.llamaindex import AmpkitLlamaIndexMemory, AmpkitMemoryBlock

url = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp()}/memory.db"


async def main() -> None:
    async with ampkit.aconnect(url, agent_id="llamaindex-assistant") as client:
        await client.remember("Ada works in the Lisbon office", owner_id="ada")
        llm = LlamaIndexFakeLLM("Lisbon, noted.")
        agent = FunctionAgent(name="assistant", description="helps Ada", llm=llm, tools=[])

        # The whole memory in ampkit: chat history per session + shared facts recalled.
        memory = AmpkitLlamaIndexMemory(client=client, owner_id="ada", session_id="monday")
        await agent.run(user_msg="Book a desk in my office", memory=memory)
        print("the model saw:", llm.prompts[-1].splitlines()[:3])
        print("session history:", [m.content for m in await memory.aget_all()])

        # Or ampkit as one long-term block beside LlamaIndex's own short-term memory.
        memory = Memory.from_defaults(session_id="tuesday", memory_blocks=[AmpkitMemoryBlock(client=client, owner_id="ada")])
        await agent.run(user_msg="Which office am I in?", memory=memory)
        print("with a block, the model saw:", [line for line in llm.prompts[-1].splitlines() if "Lisbon" in line])


asyncio.run(main())
