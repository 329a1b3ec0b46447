"""AutoGen 0.7 AssistantAgent with ampkit memory (`memory=[...]`, a list).

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/autogen_agent.py

Without AMPKIT_URL it uses a fresh SQLite file in process. The model client is an offline
replaying fake; replace it with any ChatCompletionClient.
"""

import asyncio
import os
import tempfile

from autogen_agentchat.agents import AssistantAgent
from autogen_core.memory import MemoryContent, MemoryMimeType

import ampkit
from ampkit.adapters.autogen import AmpkitAutoGenMemory
from fakes.autogen import AutoGenFakeModel

url = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp()}/memory.db"


async def main() -> None:
    memory = AmpkitAutoGenMemory(ampkit.aconnect(url, agent_id="autogen-assistant"), owner_id="ada")
    # AutoGen agents never write memory themselves: your code (or a tool) adds to it.
    await memory.add(MemoryContent(content="Ada is vegetarian", mime_type=MemoryMimeType.TEXT))

    model = AutoGenFakeModel("A vegetarian place, then.")
    agent = AssistantAgent("assistant", model_client=model, memory=[memory])
    result = await agent.run(task="Pick a restaurant for Ada, she is vegetarian? Check.")
    print("the model saw:", [line for line in model.prompts[0].splitlines() if "vegetarian" in line])
    print("answer:", result.messages[-1].content)
    print("component config:", memory.dump_component().config)
    await memory.close()


asyncio.run(main())
