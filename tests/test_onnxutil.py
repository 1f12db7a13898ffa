"""The shared ONNX helpers: node kinds and the walks over subgraphs."""

from __future__ import annotations

from onnx import TensorProto, helper

from offloadctl.core.onnxutil import (
    copy_kind,
    is_backward,
    is_constant_node,
    iter_graphs,
    named_subgraphs,
    outer_names,
    rename_outer,
    subgraph_outer_names,
    subgraphs,
)


def _graph(nodes, name, outputs=("r",), **kwargs):
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4]) for o in outputs], **kwargs
    )


def _nested_if():
    """If(c) then: body holding If(c) {then: reads outer 'a'; else: defines its own 'a'}; else: reads 'a'."""
    inner_own = _graph([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Add", ["a", "a"], ["r"])], "own")
    inner_outer = _graph([helper.make_node("Mul", ["a", "x"], ["r"])], "outer")
    nested_if = helper.make_node("If", ["c"], ["t"], then_branch=inner_outer, else_branch=inner_own)
    body = _graph([nested_if], "body", outputs=("t",))
    return helper.make_node(
        "If", ["c"], ["y"], then_branch=body, else_branch=_graph([helper.make_node("Mul", ["a", "x"], ["r"])], "outer2")
    )


def test_node_kinds():
    assert is_constant_node(helper.make_node("Constant", [], ["k"], value_float=1.0))
    assert is_constant_node(helper.make_node("Constant", [], ["k"], domain="ai.onnx", value_float=1.0))
    assert not is_constant_node(helper.make_node("Constant", [], ["k"], domain="custom"))
    assert copy_kind(helper.make_node("MemcpyToHost", ["a"], ["b"])) == "d2h"
    assert copy_kind(helper.make_node("MemcpyFromHost", ["a"], ["b"])) == "h2d"
    assert copy_kind(helper.make_node("MemcpyToHost", ["a"], ["b"], domain="com.microsoft")) is None
    assert copy_kind(helper.make_node("Identity", ["a"], ["b"])) is None
    assert is_backward(helper.make_node("Relu", ["a"], ["b"], __backwardpass=1))
    assert not is_backward(helper.make_node("Relu", ["a"], ["b"], __backwardpass=0))
    assert not is_backward(helper.make_node("Relu", ["a"], ["b"]))


def test_subgraph_walks():
    node = _nested_if()
    assert [name for name, _ in named_subgraphs(node)] == ["else_branch", "then_branch"]  # helper sorts them
    assert [g.name for g in subgraphs(node)] == ["outer2", "body"]
    assert sorted(g.name for body in subgraphs(node) for g in iter_graphs(body)) == ["body", "outer", "outer2", "own"]
    # the nested else-branch defines its own 'a'; 'x' is read from outside everywhere
    assert subgraph_outer_names(node) == {"a", "x", "c"}
    own = next(g for body in subgraphs(node) for g in iter_graphs(body) if g.name == "own")
    assert outer_names(own) == {"x"}
    assert subgraph_outer_names(helper.make_node("Relu", ["a"], ["b"])) == set()


def test_subgraph_rename_skips_bodies_that_define_the_name():
    node = _nested_if()
    assert sum(rename_outer(g, "a", "a2") for g in subgraphs(node)) == 2  # the nested then-branch and the else-branch
    graphs = {g.name: g for body in subgraphs(node) for g in iter_graphs(body)}
    assert list(graphs["outer"].node[0].input) == ["a2", "x"]
    assert list(graphs["outer2"].node[0].input) == ["a2", "x"]
    assert list(graphs["own"].node[1].input) == ["a", "a"]  # its own 'a' is left alone


def test_a_sparse_initializer_of_the_body_shadows_the_outer_name():
    values = helper.make_tensor("a", TensorProto.FLOAT, [1], [2.0])
    indices = helper.make_tensor("a_idx", TensorProto.INT64, [1], [0])
    sparse = helper.make_sparse_tensor(values, indices, [4])
    body = _graph([helper.make_node("Mul", ["a", "x"], ["r"])], "body", sparse_initializer=[sparse])
    assert outer_names(body) == {"x"}
    assert rename_outer(body, "a", "a2") == 0
    assert list(body.node[0].input) == ["a", "x"]
