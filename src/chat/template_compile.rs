//! Compiling a chat template into bytecode whose data-dependent operations are all bounded.
//!
//! Owns [`compile`]: minijinja's parser and code generator (the `unstable_machinery` API),
//! then one pass over the instructions that replaces each operator whose cost depends on its
//! operands with a call of the matching bounded function of `chat::template_bounds` (same stack
//! effect: pop the operands, push the result), and each raw-text emit with a constant emitted
//! through the bounded formatter (so captured text is counted too). Jump targets are relocated
//! for the instructions that become two.

use super::template_bounds as b;
use minijinja::machinery::{self, ast, CodeGenerator, Instruction, Instructions, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::Error;
use std::collections::BTreeMap;

/// Root instructions and block instructions of a compiled template.
pub struct Compiled<'s> {
    pub root: Instructions<'s>,
    pub blocks: BTreeMap<&'s str, Instructions<'s>>,
}

/// Template name used for instructions and error locations.
pub const NAME: &str = "chat";

/// Parse and compile `source` (HF's whitespace rules: `trim_blocks`, `lstrip_blocks`), then
/// bound it.
pub fn compile(source: &str) -> Result<Compiled<'_>, Error> {
    let ws = WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    };
    let ast = machinery::parse(source, NAME, SyntaxConfig, ws)?;
    // The code generator folds constant expressions with minijinja's unbounded operators:
    // evaluate them first with the bounded ones (and refuse the template if one is too big).
    {
        let _scope = b::RenderScope::begin();
        fold_stmt(&ast)?;
    }
    let mut g = CodeGenerator::new(NAME, source);
    g.compile_stmt(&ast);
    let (root, blocks) = g.finish();
    Ok(Compiled {
        root: bound(&root),
        blocks: blocks.iter().map(|(k, v)| (*k, bound(v))).collect(),
    })
}

// ------------------------------------------------------------------------------------------
// Constant folding, bounded. Mirrors `ast::Expr::as_const`: literals, flat literal lists and
// maps, `not`/`-`, binary operators and comparison chains over constants. The generator calls
// `as_const` once per ancestor of a node, so a folded node's work is charged that many times.

fn fold_stmts(v: &[ast::Stmt<'_>]) -> Result<(), Error> {
    v.iter().try_for_each(fold_stmt)
}

fn fold_opt(e: &Option<ast::Expr<'_>>) -> Result<(), Error> {
    match e {
        Some(e) => fold_expr(e, 0).map(|_| ()),
        None => Ok(()),
    }
}

fn fold_args(args: &[ast::CallArg<'_>], depth: u64) -> Result<(), Error> {
    for a in args {
        match a {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => {
                fold_expr(e, depth + 1)?;
            }
        }
    }
    Ok(())
}

fn fold_call(c: &ast::Call<'_>, depth: u64) -> Result<(), Error> {
    fold_expr(&c.expr, depth + 1)?;
    fold_args(&c.args, depth)
}

fn fold_stmt(s: &ast::Stmt<'_>) -> Result<(), Error> {
    use ast::Stmt as S;
    let top = |e: &ast::Expr<'_>| fold_expr(e, 0).map(|_| ());
    match s {
        S::Template(t) => fold_stmts(&t.children),
        S::EmitExpr(e) => top(&e.expr),
        S::EmitRaw(_) | S::Continue(_) | S::Break(_) => Ok(()),
        S::ForLoop(f) => {
            top(&f.target)?;
            top(&f.iter)?;
            fold_opt(&f.filter_expr)?;
            fold_stmts(&f.body)?;
            fold_stmts(&f.else_body)
        }
        S::IfCond(i) => {
            top(&i.expr)?;
            fold_stmts(&i.true_body)?;
            fold_stmts(&i.false_body)
        }
        S::WithBlock(w) => {
            for (a, b) in &w.assignments {
                top(a)?;
                top(b)?;
            }
            fold_stmts(&w.body)
        }
        S::Set(x) => {
            top(&x.target)?;
            top(&x.expr)
        }
        S::SetBlock(x) => {
            top(&x.target)?;
            fold_opt(&x.filter)?;
            fold_stmts(&x.body)
        }
        S::AutoEscape(a) => {
            top(&a.enabled)?;
            fold_stmts(&a.body)
        }
        S::FilterBlock(f) => {
            top(&f.filter)?;
            fold_stmts(&f.body)
        }
        S::Block(x) => fold_stmts(&x.body),
        S::Import(x) => {
            top(&x.expr)?;
            top(&x.name)
        }
        S::FromImport(x) => {
            top(&x.expr)?;
            for (a, b) in &x.names {
                top(a)?;
                fold_opt(b)?;
            }
            Ok(())
        }
        S::Extends(x) => top(&x.name),
        S::Include(x) => top(&x.name),
        S::Macro(m) => fold_macro(m),
        S::CallBlock(c) => {
            fold_call(&c.call, 0)?;
            fold_macro(&c.macro_decl)
        }
        S::Do(d) => fold_call(&d.call, 0),
    }
}

fn fold_macro(m: &ast::Macro<'_>) -> Result<(), Error> {
    for a in m.args.iter().chain(m.defaults.iter()) {
        fold_expr(a, 0)?;
    }
    fold_stmts(&m.body)
}

fn binop_name(op: &ast::BinOpKind) -> &'static str {
    use ast::BinOpKind as K;
    match op {
        K::Eq => "==",
        K::Ne => "!=",
        K::Lt => "<",
        K::Lte => "<=",
        K::Gt => ">",
        K::Gte => ">=",
        K::ScAnd => "and",
        K::ScOr => "or",
        K::Add => "+",
        K::Sub => "-",
        K::Mul => "*",
        K::Div => "/",
        K::FloorDiv => "//",
        K::Rem => "%",
        K::Pow => "**",
        K::Concat => "~",
        K::In => "in",
    }
}

fn compare_name(op: &ast::CompareOpKind) -> &'static str {
    use ast::CompareOpKind as K;
    match op {
        K::Eq => "==",
        K::Ne => "!=",
        K::Lt => "<",
        K::Lte => "<=",
        K::Gt => ">",
        K::Gte => ">=",
        K::In => "in",
        K::NotIn => "not in",
    }
}

/// The constant value of `e` if minijinja will fold it, after checking (and charging, once
/// per ancestor: `depth`) every operator on the way; walks every subexpression.
fn fold_expr(e: &ast::Expr<'_>, depth: u64) -> Result<Option<Value>, Error> {
    use ast::Expr as E;
    let d = depth + 1;
    let folded = match e {
        E::Const(c) => Some(c.value.clone()),
        E::Var(_) => None,
        E::List(l) => {
            for x in &l.items {
                fold_expr(x, d)?;
            }
            if l.items.iter().all(|x| matches!(x, E::Const(_))) {
                Some(Value::from(
                    l.items
                        .iter()
                        .filter_map(|x| match x {
                            E::Const(c) => Some(c.value.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                ))
            } else {
                None
            }
        }
        E::Map(m) => {
            for x in m.keys.iter().chain(m.values.iter()) {
                fold_expr(x, d)?;
            }
            None // a flat literal map: small, source-sized
        }
        E::UnaryOp(u) => {
            let v = fold_expr(&u.expr, d)?;
            match (&u.op, v) {
                (ast::UnaryOpKind::Not, Some(v)) => Some(Value::from(!v.is_true())),
                (ast::UnaryOpKind::Neg, Some(v)) => b::fold_neg(&v),
                _ => None,
            }
        }
        E::BinOp(x) => {
            let l = fold_expr(&x.left, d)?;
            let r = fold_expr(&x.right, d)?;
            match (l, r) {
                (Some(l), Some(r)) => {
                    // The generator folds this node once per ancestor (and once itself).
                    let mut out = None;
                    for _ in 0..=depth.min(64) {
                        out = b::fold_binop(binop_name(&x.op), &l, &r)?;
                    }
                    out
                }
                _ => None,
            }
        }
        E::Compare(c) => {
            let mut left = fold_expr(&c.expr, d)?;
            let mut result = left.is_some();
            let mut falsy = false;
            for op in &c.ops {
                let right = fold_expr(&op.expr, d)?;
                match (&left, &right) {
                    (Some(l), Some(r)) if !falsy => {
                        let name = compare_name(&op.op);
                        let t =
                            match b::fold_compare(if name == "not in" { "in" } else { name }, l, r)
                            {
                                Ok(t) => t != (name == "not in"),
                                Err(e) if b::is_limit(&e) => return Err(e),
                                // Not foldable (a type error at run time instead).
                                Err(_) => {
                                    result = false;
                                    true
                                }
                            };
                        falsy |= !t;
                    }
                    (_, None) => result = false,
                    _ => {}
                }
                left = right;
            }
            result.then(|| Value::from(!falsy))
        }
        E::Slice(x) => {
            fold_expr(&x.expr, d)?;
            fold_opt_d(&x.start, d)?;
            fold_opt_d(&x.stop, d)?;
            fold_opt_d(&x.step, d)?;
            None
        }
        E::IfExpr(x) => {
            fold_expr(&x.test_expr, d)?;
            fold_expr(&x.true_expr, d)?;
            fold_opt_d(&x.false_expr, d)?;
            None
        }
        E::Filter(f) => {
            fold_opt_d(&f.expr, d)?;
            fold_args(&f.args, depth)?;
            None
        }
        E::Test(t) => {
            fold_expr(&t.expr, d)?;
            fold_args(&t.args, depth)?;
            None
        }
        E::GetAttr(g) => {
            fold_expr(&g.expr, d)?;
            None
        }
        E::GetItem(g) => {
            fold_expr(&g.expr, d)?;
            fold_expr(&g.subscript_expr, d)?;
            None
        }
        E::Call(c) => {
            fold_call(c, depth)?;
            None
        }
    };
    if let Some(v) = &folded {
        b::weight(v)?;
    }
    Ok(folded)
}

fn fold_opt_d(e: &Option<ast::Expr<'_>>, depth: u64) -> Result<(), Error> {
    match e {
        Some(e) => fold_expr(e, depth).map(|_| ()),
        None => Ok(()),
    }
}

fn call(name: &'static str, args: u16) -> Instruction<'static> {
    Instruction::CallFunction(name, Some(args))
}

/// Index into [`b::OP_CHAIN`] of the comparison in a `CompareAndPreserve` instruction. The
/// comparison type is not exported by minijinja, so it is recognised by its discriminant,
/// taken from the code generated for `a OP b OP c` for each operator.
fn chain_index(ins: &Instruction<'_>) -> Option<usize> {
    let Instruction::CompareAndPreserve(op) = ins else {
        return None;
    };
    let want = std::mem::discriminant(op);
    const OPS: [&str; 8] = ["==", "!=", "<", "<=", ">", ">=", "in", "not in"];
    for (i, o) in OPS.iter().enumerate() {
        let src = format!("{{{{ a {o} b {o} c }}}}");
        let Ok(ast) = machinery::parse(&src, NAME, SyntaxConfig, Default::default()) else {
            continue;
        };
        let mut g = CodeGenerator::new(NAME, &src);
        g.compile_stmt(&ast);
        let (reference, _) = g.finish();
        let found = (0..reference.len() as u32).any(|k| {
            matches!(reference.get(k), Some(Instruction::CompareAndPreserve(r))
                if std::mem::discriminant(r) == want)
        });
        if found {
            return Some(i);
        }
    }
    None
}

/// The replacement of one instruction (one or two instructions).
fn replace<'s>(ins: &Instruction<'s>) -> Option<Vec<Instruction<'s>>> {
    Some(match ins {
        Instruction::Add => vec![call(b::OP_ADD, 2)],
        Instruction::Mul => vec![call(b::OP_MUL, 2)],
        Instruction::StringConcat => vec![call(b::OP_CONCAT, 2)],
        Instruction::In => vec![call(b::OP_IN, 2)],
        Instruction::GetItem => vec![call(b::OP_GETITEM, 2)],
        Instruction::Slice => vec![call(b::OP_SLICE, 4)],
        Instruction::Eq => vec![call(b::OP_EQ, 2)],
        Instruction::Ne => vec![call(b::OP_NE, 2)],
        Instruction::Lt => vec![call(b::OP_LT, 2)],
        Instruction::Lte => vec![call(b::OP_LTE, 2)],
        Instruction::Gt => vec![call(b::OP_GT, 2)],
        Instruction::Gte => vec![call(b::OP_GTE, 2)],
        Instruction::BuildList(Some(n)) => vec![call(b::OP_LIST, u16::try_from(*n).ok()?)],
        Instruction::BuildMap(n) => vec![call(b::OP_MAP, u16::try_from(n * 2).ok()?)],
        Instruction::EmitRaw(s) => vec![Instruction::LoadConst(Value::from(*s)), Instruction::Emit],
        Instruction::SetAttr(_) => vec![
            call(b::OP_SETATTR_CHECK, 2),
            Instruction::UnpackList(2),
            ins.clone(),
        ],
        Instruction::CompareAndPreserve(_) => {
            vec![
                call(b::OP_CHAIN[chain_index(ins)?], 2),
                Instruction::UnpackList(2),
            ]
        }
        _ => return None,
    })
}

fn retarget(ins: &mut Instruction<'_>, map: &[u32]) {
    let fix = |t: &mut u32| *t = map[(*t as usize).min(map.len() - 1)];
    match ins {
        Instruction::Jump(t)
        | Instruction::JumpIfFalse(t)
        | Instruction::JumpIfFalseOrPop(t)
        | Instruction::JumpIfTrueOrPop(t)
        | Instruction::Iterate(t) => fix(t),
        Instruction::BuildMacro(_, t, _) => fix(t),
        _ => {}
    }
}

/// Rewrite `ins` into bounded instructions (see the module doc).
pub fn bound<'s>(ins: &Instructions<'s>) -> Instructions<'s> {
    let n = ins.len();
    let items: Vec<Vec<Instruction<'s>>> = (0..n as u32)
        .map(|i| {
            let x = ins.get(i).expect("index below len");
            replace(x).unwrap_or_else(|| vec![x.clone()])
        })
        .collect();
    // map[old] = new index; map[n] = new length (jumps to the end).
    let mut map = Vec::with_capacity(n + 1);
    let mut at = 0u32;
    for it in &items {
        map.push(at);
        at += it.len() as u32;
    }
    map.push(at);
    let mut out = Instructions::new(ins.name(), ins.source());
    for (i, it) in items.into_iter().enumerate() {
        for mut x in it {
            retarget(&mut x, &map);
            match (ins.get_span(i as u32), ins.get_line(i as u32)) {
                (Some(span), _) => out.add_with_span(x, span),
                (None, Some(line)) => out.add_with_line(x, line as u16),
                _ => out.add(x),
            };
        }
    }
    out
}
