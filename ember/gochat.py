"""A chat through a Go template (gotemplate.py) as Ollama's Template.Execute renders it: the
values the template sees (System, Messages, Tools, Think...); and the older templates without
.Messages, executed once per turn with .System, .Prompt and .Response, the last cut after its
.Response (left open for the answer, or for continuing a final assistant message)."""

import json
from typing import Any

from ember.gofuncs import GoList, GoMap, GoStruct, go_json
from ember.gotemplate import GoTemplate


def render_go(
    template: GoTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    think: bool | str | None = None,
) -> str:
    """messages: dicts as the server's prompts make them (role, content, tool_calls,
    thinking...); think: as the request's (a level, a bool, or None when not set)."""
    system, collated = _collate(messages)
    values = _think_values(think)
    if "messages" in template.identifiers:
        values |= {
            "System": system,
            "Messages": [_message(m) for m in collated],
            "Tools": _tools(tools),
            "Response": "",
        }
        return template.render(values)
    out: list[str] = []
    nodes = template.ending_with_response()
    turn = {"System": "", "Prompt": "", "Response": ""}
    for m in collated:
        role, content = m["role"], m.get("content", "")
        if (role == "system" and (turn["Prompt"] or turn["Response"])) or (
            role == "user" and turn["Response"]
        ):
            out.append(template.render(values | turn, nodes))
            turn = {"System": "", "Prompt": "", "Response": ""}
        key = {"system": "System", "user": "Prompt", "assistant": "Response"}.get(role)
        if key:
            turn[key] = content
    out.append(template.render(values | turn, template.cut_after_response()))
    return "".join(out)


def render_go_fill(template: GoTemplate, prompt: str, suffix: str, think: bool | str | None) -> str:
    """A gap to fill, as Ollama executes a template that reads .Suffix: Prompt and Suffix."""
    values = {"Prompt": prompt, "Suffix": suffix, "Response": ""}
    return template.render(values | _think_values(think))


def _think_values(think: bool | str | None) -> dict[str, Any]:
    return {
        "Think": think is not None and think is not False,
        # Ollama's ThinkValue.String: true is the default level
        "ThinkLevel": think if isinstance(think, str) else ("medium" if think else ""),
        "IsThinkSet": think is not None,
    }


def _collate(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Every system message's text, and the messages with runs of one role merged (tool
    results stay apart), as Ollama's collate."""
    system = [m.get("content", "") for m in messages if m["role"] == "system"]
    collated: list[dict[str, Any]] = []
    for m in messages:
        if collated and collated[-1]["role"] == m["role"] and m["role"] != "tool":
            collated[-1] = collated[-1] | {
                "content": collated[-1].get("content", "") + "\n\n" + m.get("content", "")
            }
        else:
            collated.append(m)
    return "\n\n".join(system), collated


def _message(m: dict[str, Any]) -> dict[str, Any]:
    calls = [_tool_call(i, c) for i, c in enumerate(m.get("tool_calls") or ())]
    return {
        "Role": m["role"],
        "Content": m.get("content", ""),
        "Thinking": m.get("thinking", ""),
        "Images": [],
        "ToolCalls": calls,  # a nil slice in Go: false, and prints []
        "ToolName": m.get("tool_name", ""),
        "ToolCallID": m.get("tool_call_id", ""),
    }


def _tool_call(index: int, call: dict[str, Any]) -> GoStruct:
    fn = call.get("function") or {}
    args = fn.get("arguments") or {}
    if isinstance(args, str):  # OpenAI's clients send the arguments as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    if not isinstance(args, dict):
        args = {}
    arguments = GoMap(args, go_json(args))
    function = GoStruct(
        {"Index": fn.get("index", index), "Name": fn.get("name", ""), "Arguments": arguments},
        _struct_json(index=fn.get("index", index), name=fn.get("name", ""), arguments=args),
    )
    return GoStruct(
        {"ID": call.get("id", ""), "Function": function},
        _struct_json(id=call.get("id") or None, function=function),
    )


def _tools(tools: list[dict[str, Any]] | None) -> GoList:
    if not tools:  # Go's nil slice: false, length 0, and its JSON null
        return GoList([], "null")
    items = [_tool(t) for t in tools]
    return GoList(items, "[" + ",".join(t.json for t in items) + "]")


def _tool(tool: dict[str, Any]) -> GoStruct:
    fn = tool.get("function") or {}
    params = fn.get("parameters") or {}
    props = params.get("properties")
    named = {name: _property(p) for name, p in sorted((props or {}).items()) if isinstance(p, dict)}
    properties = GoMap(
        named, "{" + ",".join(f"{json.dumps(k)}:{v.json}" for k, v in named.items()) + "}"
    )
    # a tool without properties has a nil map: it prints {} but is null in the tool's JSON
    properties_json = properties if isinstance(props, dict) else GoMap({}, "null")
    parameters = GoStruct(
        {
            "Type": params.get("type", ""),
            "Defs": params.get("$defs"),
            "Items": params.get("items"),
            "Required": params.get("required"),
            "Properties": properties,
        },
        _struct_json(
            type=params.get("type", ""),
            **{"$defs": params.get("$defs")},
            items=params.get("items"),
            required=params.get("required") or None,
            properties=properties_json,
        ),
    )
    function = GoStruct(
        {
            "Name": fn.get("name", ""),
            "Description": fn.get("description", ""),
            "Parameters": parameters,
        },
        _struct_json(
            name=fn.get("name", ""),
            description=fn.get("description", ""),
            parameters=parameters,
        ),
    )
    return GoStruct(
        {"Type": tool.get("type", "function"), "Items": tool.get("items"), "Function": function},
        _struct_json(
            type=tool.get("type", "function"),
            items=tool.get("items"),
            function=function,
        ),
    )


def _property(p: dict[str, Any]) -> GoStruct:
    kind = p.get("type")
    fields = {
        "AnyOf": [_property(a) for a in p.get("anyOf") or () if isinstance(a, dict)] or None,
        "Type": kind,
        "Items": p.get("items"),
        "Description": p.get("description", ""),
        "Enum": p.get("enum"),
        "Properties": p.get("properties"),
        "Required": p.get("required"),
    }
    return GoStruct(
        fields,
        _struct_json(
            anyOf=fields["AnyOf"],
            type=kind or None,
            items=p.get("items"),
            description=p.get("description") or None,
            enum=p.get("enum") or None,
            properties=p.get("properties") or None,
            required=p.get("required") or None,
        ),
    )


def _struct_json(**fields: Any) -> str:
    """A Go struct's JSON: its fields in their order, None ones left out (omitempty)."""
    body = ",".join(f"{json.dumps(k)}:{go_json(v)}" for k, v in fields.items() if v is not None)
    return "{" + body + "}"
