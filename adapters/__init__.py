"""Framework adapters: LangChain/LangGraph, LlamaIndex, CrewAI and AutoGen agents on one
shared ampkit memory. Each framework has its own module, importable once its extra is
installed (`pip install 'ampkit[langchain]'`, `[llamaindex]`, `[crewai]`, `[autogen]`):

    ampkit.adapters.langchain   AmpkitStore, SharedMemoryMiddleware, AmpkitChatMessageHistory,
                                AmpkitRetriever, memory_tools
    ampkit.adapters.llamaindex  AmpkitMemory, AmpkitMemoryBlock
    ampkit.adapters.crewai      AmpkitCrewMemory
    ampkit.adapters.autogen     AmpkitMemory
    ampkit.adapters.fakes       offline fake models that record their prompts (tests, demo)

This package itself imports no framework. See docs/adapters.md for the mapping table.
"""

from ._mapping import FRAMEWORK_TAG, SCOPE_TAG, Sharing

__all__ = ["FRAMEWORK_TAG", "SCOPE_TAG", "Sharing"]
