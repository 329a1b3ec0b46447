"""Framework adapters: LangChain/LangGraph, LlamaIndex, CrewAI and AutoGen agents on one
shared ampkit memory. Each framework has its own module, importable once its extra is
installed (`pip install 'ampkit[langchain]'`, `[llamaindex]`, `[crewai]`, `[autogen]`):

    ampkit.adapters.langchain   AmpkitStore, SharedMemoryMiddleware, RefusedWriteMiddleware,
                                AmpkitChatMessageHistory, AmpkitRetriever, memory_tools
    ampkit.adapters.llamaindex  AmpkitLlamaIndexMemory, AmpkitMemoryBlock
    ampkit.adapters.crewai      AmpkitCrewMemory
    ampkit.adapters.autogen     AmpkitAutoGenMemory

Offline fake models for each framework (tests, examples, the demo) are in `examples/fakes/`,
not in the package.

This package itself imports no framework. See docs/adapters.md for the mapping table.
"""

from ._mapping import FRAMEWORK_TAG, SCOPE_TAG, Sharing

__all__ = ["FRAMEWORK_TAG", "SCOPE_TAG", "Sharing"]
