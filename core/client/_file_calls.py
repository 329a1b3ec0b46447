"""Call builders of the files API (docs/files.md), as `_calls` builds the cell operations."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from ..files.models import (
    ApprovalMode,
    FileContent,
    FileHistoryResponse,
    FileListResponse,
    FileSearchResponse,
    FileWriteResult,
    GrepResponse,
    Proposal,
    ProposalList,
)
from ..models import AccessPolicy
from ._calls import Call, call


def _query(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _body(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def list_files(owner_id: str, glob: Optional[str] = None) -> Call[FileListResponse]:
    return call("list_files", FileListResponse.model_validate, query=_query(owner_id=owner_id, glob=glob))


def read_file(path: str, owner_id: str, offset: int = 0, limit: int = 2000) -> Call[FileContent]:
    return call("read_file", FileContent.model_validate,
                query=_query(owner_id=owner_id, path=path, offset=offset, limit=limit))


def write_file(path: str, content: str, owner_id: str, reason: Optional[str] = None,
               expected_version: Optional[int] = None, readable_by: Optional[Iterable[str]] = None,
               writable_by: Optional[Iterable[str]] = None, public: Optional[bool] = None,
               access_policy: Union[AccessPolicy, Mapping[str, Any], None] = None) -> Call[FileWriteResult]:
    """The policy of a new file: `access_policy` (the wire's name and shape) or its three
    fields as keywords, not both."""
    policy = _body(readable_by=None if readable_by is None else list(readable_by),
                   writable_by=None if writable_by is None else list(writable_by), public=public)
    if access_policy is not None:
        if policy:
            raise TypeError("write_file: give access_policy or readable_by/writable_by/public, not both")
        # A mapping goes as it is: the server validates it and answers in the error envelope.
        policy = access_policy.model_dump() if isinstance(access_policy, AccessPolicy) else dict(access_policy)
    return call("write_file", FileWriteResult.model_validate,
                body=_body(owner_id=owner_id, path=path, content=content, reason=reason,
                           expected_version=expected_version, access_policy=policy or None))


def edit_file(path: str, old: str, new: str, owner_id: str, replace_all: bool = False, reason: Optional[str] = None,
              expected_version: Optional[int] = None) -> Call[FileWriteResult]:
    return call("edit_file", FileWriteResult.model_validate,
                body=_body(owner_id=owner_id, path=path, old=old, new=new, replace_all=replace_all, reason=reason,
                           expected_version=expected_version))


def delete_file(path: str, owner_id: str, reason: Optional[str] = None,
                expected_version: Optional[int] = None) -> Call[FileWriteResult]:
    return call("delete_file", FileWriteResult.model_validate,
                body=_body(owner_id=owner_id, path=path, reason=reason, expected_version=expected_version))


def grep_files(pattern: str, owner_id: str, glob: Optional[str] = None, max_count: int = 200) -> Call[GrepResponse]:
    return call("grep_files", GrepResponse.model_validate,
                query=_query(owner_id=owner_id, pattern=pattern, glob=glob, max_count=max_count))


def search_files(query: str, owner_id: str, glob: Optional[str] = None, limit: int = 10) -> Call[FileSearchResponse]:
    return call("search_files", FileSearchResponse.model_validate,
                body=_body(owner_id=owner_id, query=query, glob=glob, limit=limit))


def file_history(path: str, owner_id: str) -> Call[FileHistoryResponse]:
    return call("file_history", FileHistoryResponse.model_validate, query=_query(owner_id=owner_id, path=path))


def get_approval_mode(owner_id: str) -> Call[ApprovalMode]:
    return call("get_approval_mode", ApprovalMode.model_validate, query={"owner_id": owner_id})


def set_approval_mode(owner_id: str, mode: str) -> Call[ApprovalMode]:
    return call("set_approval_mode", ApprovalMode.model_validate, body={"owner_id": owner_id, "approval_mode": mode})


def list_proposals(owner_id: Optional[str] = None, status: Optional[str] = None,
                   proposed_by: Optional[str] = None) -> Call[list[Proposal]]:
    return call("list_proposals", lambda body: ProposalList.model_validate(body).results,
                query=_query(owner_id=owner_id, status=status, proposed_by=proposed_by))


def get_proposal(proposal_id: str) -> Call[Proposal]:
    return call("get_proposal", Proposal.model_validate, path_params={"proposal_id": proposal_id})


def approve_proposal(proposal_id: str, content: Optional[str] = None, message: Optional[str] = None) -> Call[Proposal]:
    return call("approve_proposal", Proposal.model_validate, path_params={"proposal_id": proposal_id},
                body=_body(content=content, message=message))


def reject_proposal(proposal_id: str, message: Optional[str] = None) -> Call[Proposal]:
    return call("reject_proposal", Proposal.model_validate, path_params={"proposal_id": proposal_id},
                body=_body(message=message))
