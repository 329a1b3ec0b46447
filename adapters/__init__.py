"""Framework adapters: LangChain/LangGraph, LlamaIndex, CrewAI and AutoGen agents on one
shared ampkit memory. Each framework has its own module, importable once its extra is
installed (`pip install 'ampkit[langchain]'`, `[llamaindex]`, `[crewai]`, `[autogen]`):

    ampkit.adapters.langchain   AmpkitStore, SharedMemoryMiddleware, RefusedWriteMiddleware,
                                AmpkitChatMessageHistory, AmpkitRetriever, memory_tools
    ampkit.adapters.llamaindex  AmpkitLlamaIndexMemory, AmpkitMemoryBlock
    ampkit.adapters.crewai      AmpkitCrewMemory
    ampkit.adapters.autogen     AmpkitAutoGenMemory
    ampkit.adapters.deepagents  AmpkitBackend (a DeepAgents backend over an owner's memory folder;
                                `pip install 'ampkit[deepagents]'`, docs/files.md)

With `instructions=True`, the LangChain middleware, the LlamaIndex memory and block, the CrewAI
memory and the AutoGen memory put the owner's AGENTS.md and skills index into the model's
context (docs/files.md#every-framework-reads-the-same-instructions).

Offline fake models for each framework (tests, examples, the demo) are in `examples/fakes/`,
not in the package.

This package itself imports no framework. See docs/adapters.md for the mapping table.
"""

from ._mapping import FRAMEWORK_TAG, SCOPE_TAG, Sharing

__all__ = ["FRAMEWORK_TAG", "SCOPE_TAG", "Sharing"]
