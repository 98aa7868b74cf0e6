//! A strict reader of the Python pickles the paper's feature datasets are published as:
//! SpherePair's `*_pretrained_dataset.pkl` (a tuple `(X, y)` of numpy arrays) and the
//! Reuters-10k files (`np.save` of a dict `{'data': X, 'label': y}`, a pickle inside a 0-d
//! object `.npy`).
//!
//! No maintained Rust crate reads numpy arrays out of pickles (serde-pickle resolves no
//! globals), so this is a small stack machine over the opcodes of protocols 2 to 5 that
//! `pickle.dump` writes for tuples, lists, dicts, strings, numbers, bytes and numpy arrays. It
//! never executes anything: the only globals it accepts are numpy's array and dtype
//! reconstructors and `_codecs.encode` (how protocol 2 stores bytes), each interpreted here;
//! any other global, an out-of-band buffer or an unknown opcode is refused with the offset and
//! what was found.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::error::{DataPlace, Result, StageError};

/// A decoded value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Rc<Vec<u8>>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    /// Keys and values in insertion order.
    Dict(Vec<(Value, Value)>),
    Array(Array),
}

/// A numpy array: dtype descriptor (`<f4`, `<i8`, `|O`, ...), shape, memory order and data.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub descr: String,
    pub shape: Vec<usize>,
    pub fortran: bool,
    pub data: ArrayData,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// The raw bytes of a numeric array.
    Raw(Rc<Vec<u8>>),
    /// The elements of an object array.
    Objects(Vec<Value>),
}

/// What a (whitelisted) global stands for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Global {
    Reconstruct,
    /// `numpy._core.numeric._frombuffer(buffer, dtype, shape, order)`: how numpy pickles an
    /// array under protocol 5.
    FromBuffer,
    NdArray,
    Dtype,
    Encode,
}

/// An object built in place (so that memo references see later `BUILD`s and appends).
#[derive(Debug)]
enum Obj {
    List(Vec<Item>),
    Dict(Vec<(Item, Item)>),
    /// An array whose state has not been set yet.
    Array(Option<Array>),
    /// A dtype: its name (`f4`, `i8`, `O`) and the byte order its state gives.
    Dtype {
        name: String,
        order: Option<char>,
    },
}

#[derive(Clone, Debug)]
enum Item {
    V(Value),
    Obj(usize),
    Global(Global),
    Mark,
}

struct Machine<'a> {
    display: &'a str,
    buf: &'a [u8],
    pos: usize,
    stack: Vec<Item>,
    memo: HashMap<u64, Item>,
    objs: Vec<Obj>,
    /// Objects that are tuples (of items holding objects).
    tuples: HashSet<usize>,
    /// Values built while resolving: a pickle that shares one object many times over (a
    /// "billion laughs") is refused instead of expanded.
    resolved: std::cell::Cell<usize>,
}

/// The most values a pickle may resolve to (the paper's largest file has a handful).
const MAX_VALUES: usize = 1_000_000;

/// Decode one pickle (the whole of `buf`).
pub fn read(display: &str, buf: &[u8]) -> Result<Value> {
    let mut m = Machine {
        display,
        buf,
        pos: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        objs: Vec::new(),
        tuples: HashSet::new(),
        resolved: std::cell::Cell::new(0),
    };
    let top = m.run()?;
    m.resolve(&top, 0)
}

/// Whether `bytes` look like a pickle (protocol 2 or later).
pub fn is_pickle(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x80 && (2..=5).contains(&bytes[1])
}

impl Machine<'_> {
    fn err(&self, at: usize, message: impl Into<String>) -> StageError {
        StageError::data(
            self.display,
            DataPlace::File,
            format!(
                "is not a pickle upcc reads (at byte {at}): {}. upcc reads pickles of tuples, lists, dicts and numpy arrays (protocols 2-5) and never runs pickle code",
                message.into()
            ),
        )
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let at = self.pos;
        let end = at.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(e) => {
                self.pos = e;
                Ok(&self.buf[at..e])
            }
            None => Err(self.err(
                at,
                format!(
                    "truncated: {n} more bytes needed, {} left",
                    self.buf.len() - at
                ),
            )),
        }
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    fn line(&mut self) -> Result<String> {
        let at = self.pos;
        let rest = &self.buf[at..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err(at, "an unterminated text argument"))?;
        self.pos = at + n + 1;
        Ok(String::from_utf8_lossy(&rest[..n]).into_owned())
    }

    fn utf8(&mut self, n: usize) -> Result<String> {
        let at = self.pos;
        let b = self.take(n)?.to_vec();
        String::from_utf8(b).map_err(|_| self.err(at, "a string that is not UTF-8"))
    }

    fn pop(&mut self, at: usize) -> Result<Item> {
        match self.stack.pop() {
            Some(Item::Mark) | None => Err(self.err(at, "an opcode with nothing to work on")),
            Some(i) => Ok(i),
        }
    }

    /// The items above the topmost mark (which is removed).
    fn pop_mark(&mut self, at: usize) -> Result<Vec<Item>> {
        let k = self
            .stack
            .iter()
            .rposition(|i| matches!(i, Item::Mark))
            .ok_or_else(|| self.err(at, "a mark was expected"))?;
        let items = self.stack.split_off(k + 1);
        self.stack.pop();
        Ok(items)
    }

    fn new_obj(&mut self, o: Obj) -> Item {
        self.objs.push(o);
        Item::Obj(self.objs.len() - 1)
    }

    fn global(&self, at: usize, module: &str, name: &str) -> Result<Global> {
        let g = match (module, name) {
            ("numpy.core.multiarray" | "numpy._core.multiarray", "_reconstruct") => {
                Global::Reconstruct
            }
            ("numpy.core.numeric" | "numpy._core.numeric", "_frombuffer") => Global::FromBuffer,
            ("numpy", "ndarray") => Global::NdArray,
            ("numpy", "dtype") => Global::Dtype,
            ("_codecs", "encode") => Global::Encode,
            _ => {
                return Err(self.err(
                    at,
                    format!("a reference to `{module}.{name}`, which upcc does not call"),
                ))
            }
        };
        Ok(g)
    }

    fn run(&mut self) -> Result<Item> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if !(2..=5).contains(&p) {
                        return Err(self.err(at, format!("pickle protocol {p}")));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a size hint
                }
                b'.' => return self.pop(at),
                b'(' => self.stack.push(Item::Mark),
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let top = self.pop(at)?;
                    self.stack.push(top.clone());
                    self.stack.push(top);
                }
                b'N' => self.stack.push(Item::V(Value::None)),
                0x88 => self.stack.push(Item::V(Value::Bool(true))),
                0x89 => self.stack.push(Item::V(Value::Bool(false))),
                b'J' => {
                    let v = self.le(4)? as u32 as i32 as i64;
                    self.stack.push(Item::V(Value::Int(v)));
                }
                b'K' => {
                    let v = self.le(1)? as i64;
                    self.stack.push(Item::V(Value::Int(v)));
                }
                b'M' => {
                    let v = self.le(2)? as i64;
                    self.stack.push(Item::V(Value::Int(v)));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.le(4)? as usize
                    };
                    if n > 8 {
                        return Err(self.err(at, "an integer wider than 64 bits"));
                    }
                    let b = self.take(n)?;
                    let mut v = b.iter().rev().fold(0i64, |acc, &x| (acc << 8) | x as i64);
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.stack.push(Item::V(Value::Int(v)));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                    self.stack.push(Item::V(Value::Float(v)));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        0x8c => self.u8()? as usize,
                        b'X' => self.le(4)? as usize,
                        _ => self.le(8)? as usize,
                    };
                    let s = self.utf8(n)?;
                    self.stack.push(Item::V(Value::Str(s)));
                }
                b'T' | b'U' | b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'U' | b'C' => self.u8()? as usize,
                        b'T' | b'B' => self.le(4)? as usize,
                        _ => self.le(8)? as usize,
                    };
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Item::V(Value::Bytes(Rc::new(b))));
                }
                0x97 | 0x98 => {
                    return Err(self.err(
                        at,
                        "an out-of-band buffer (pickle protocol 5 with a buffer callback)",
                    ))
                }
                b')' => self.stack.push(Item::V(Value::Tuple(vec![]))),
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push_tuple(items)?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err(self.err(at, "a tuple of more items than the stack holds"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    if items.iter().any(|i| matches!(i, Item::Mark)) {
                        return Err(self.err(at, "a mark inside a tuple"));
                    }
                    self.push_tuple(items)?;
                }
                b']' => {
                    let o = self.new_obj(Obj::List(vec![]));
                    self.stack.push(o);
                }
                b'l' => {
                    let items = self.pop_mark(at)?;
                    let o = self.new_obj(Obj::List(items));
                    self.stack.push(o);
                }
                b'a' | b'e' => {
                    let items = if op == b'a' {
                        vec![self.pop(at)?]
                    } else {
                        self.pop_mark(at)?
                    };
                    let Some(Item::Obj(id)) = self.stack.last().cloned() else {
                        return Err(self.err(at, "an append to something that is not a list"));
                    };
                    match &mut self.objs[id] {
                        Obj::List(l) if !self.tuples.contains(&id) => l.extend(items),
                        _ => return Err(self.err(at, "an append to something that is not a list")),
                    }
                }
                b'}' => {
                    let o = self.new_obj(Obj::Dict(vec![]));
                    self.stack.push(o);
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    let pairs = self.pairs(at, items)?;
                    let o = self.new_obj(Obj::Dict(pairs));
                    self.stack.push(o);
                }
                b's' | b'u' => {
                    let items = if op == b's' {
                        let v = self.pop(at)?;
                        let k = self.pop(at)?;
                        vec![k, v]
                    } else {
                        self.pop_mark(at)?
                    };
                    let pairs = self.pairs(at, items)?;
                    let Some(Item::Obj(id)) = self.stack.last().cloned() else {
                        return Err(self.err(at, "a dict item set on something that is not a dict"));
                    };
                    match &mut self.objs[id] {
                        Obj::Dict(d) => d.extend(pairs),
                        _ => {
                            return Err(
                                self.err(at, "a dict item set on something that is not a dict")
                            )
                        }
                    }
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = self.global(at, &module, &name)?;
                    self.stack.push(Item::Global(g));
                }
                0x93 => {
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    let (Item::V(Value::Str(module)), Item::V(Value::Str(name))) = (module, name)
                    else {
                        return Err(self.err(at, "a global named by something other than strings"));
                    };
                    let g = self.global(at, &module, &name)?;
                    self.stack.push(Item::Global(g));
                }
                b'R' => {
                    let args = self.pop(at)?;
                    let f = self.pop(at)?;
                    let r = self.reduce(at, f, args)?;
                    self.stack.push(r);
                }
                b'b' => {
                    let state = self.pop(at)?;
                    let target = self.stack.last().cloned();
                    self.build(at, target, state)?;
                }
                b'p' => {
                    let k: u64 = self
                        .line()?
                        .trim()
                        .parse()
                        .map_err(|_| self.err(at, "a malformed memo key"))?;
                    self.memo_put(at, k)?;
                }
                b'q' | b'r' => {
                    let k = if op == b'q' { self.le(1)? } else { self.le(4)? };
                    self.memo_put(at, k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(at, k)?;
                }
                b'g' | b'h' | b'j' => {
                    let k = match op {
                        b'g' => self
                            .line()?
                            .trim()
                            .parse()
                            .map_err(|_| self.err(at, "a malformed memo key"))?,
                        b'h' => self.le(1)?,
                        _ => self.le(4)?,
                    };
                    let item = self
                        .memo
                        .get(&k)
                        .cloned()
                        .ok_or_else(|| self.err(at, format!("memo entry {k} is not set")))?;
                    self.stack.push(item);
                }
                other => {
                    return Err(self.err(
                        at,
                        format!("opcode 0x{other:02x} (objects upcc does not read)"),
                    ))
                }
            }
        }
    }

    fn memo_put(&mut self, at: usize, k: u64) -> Result<()> {
        let top = self
            .stack
            .last()
            .cloned()
            .filter(|i| !matches!(i, Item::Mark))
            .ok_or_else(|| self.err(at, "nothing to memoize"))?;
        self.memo.insert(k, top);
        Ok(())
    }

    fn push_tuple(&mut self, items: Vec<Item>) -> Result<()> {
        // Tuples of plain values stay values; tuples holding objects become values when the
        // whole pickle is resolved, so they are kept as a list object that is never mutated.
        if items.iter().all(|i| matches!(i, Item::V(_))) {
            let vals = items
                .into_iter()
                .map(|i| match i {
                    Item::V(v) => v,
                    _ => unreachable!("checked"),
                })
                .collect();
            self.stack.push(Item::V(Value::Tuple(vals)));
        } else {
            // A tuple holding objects: kept as an object (never mutated) until the whole
            // pickle is resolved, when it becomes a tuple value.
            self.objs.push(Obj::List(items));
            let id = self.objs.len() - 1;
            self.tuples.insert(id);
            self.stack.push(Item::Obj(id));
        }
        Ok(())
    }

    fn pairs(&self, at: usize, items: Vec<Item>) -> Result<Vec<(Item, Item)>> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err(at, "a dict with a key but no value"));
        }
        let mut it = items.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    fn reduce(&mut self, at: usize, f: Item, args: Item) -> Result<Item> {
        let Item::Global(g) = f else {
            return Err(self.err(at, "a call of something that is not a known global"));
        };
        let args = match args {
            Item::V(Value::Tuple(a)) => a.into_iter().map(Item::V).collect::<Vec<_>>(),
            Item::Obj(id) if self.tuples.contains(&id) => match &self.objs[id] {
                Obj::List(items) => items.clone(),
                _ => unreachable!("tuples are lists"),
            },
            _ => return Err(self.err(at, "call arguments that are not a tuple")),
        };
        match g {
            Global::Reconstruct => {
                if !matches!(args.first(), Some(Item::Global(Global::NdArray))) {
                    return Err(self.err(at, "_reconstruct of something other than numpy.ndarray"));
                }
                Ok(self.new_obj(Obj::Array(None)))
            }
            Global::FromBuffer => {
                let (Some(Item::V(Value::Bytes(data))), Some(dtype), Some(shape), Some(order)) =
                    (args.first(), args.get(1), args.get(2), args.get(3))
                else {
                    return Err(self.err(at, "_frombuffer without (buffer, dtype, shape, order)"));
                };
                let descr = self.descr(at, dtype)?;
                let shape = self.shape(at, shape)?;
                let fortran = match self.value_of(order)? {
                    Value::Str(o) if o == "C" => false,
                    Value::Str(o) if o == "F" => true,
                    _ => return Err(self.err(at, "_frombuffer with an order other than C or F")),
                };
                Ok(self.new_obj(Obj::Array(Some(Array {
                    descr,
                    shape,
                    fortran,
                    data: ArrayData::Raw(data.clone()),
                }))))
            }
            Global::Dtype => {
                let name = match args.first() {
                    Some(Item::V(Value::Str(s))) => s.clone(),
                    _ => return Err(self.err(at, "numpy.dtype without a name")),
                };
                Ok(self.new_obj(Obj::Dtype { name, order: None }))
            }
            Global::Encode => match (args.first(), args.get(1)) {
                (Some(Item::V(Value::Str(s))), Some(Item::V(Value::Str(enc))))
                    if enc == "latin1" || enc == "latin-1" =>
                {
                    let mut bytes = Vec::with_capacity(s.len());
                    for c in s.chars() {
                        let u = c as u32;
                        if u > 0xff {
                            return Err(self.err(at, "latin1 text with a character above U+00FF"));
                        }
                        bytes.push(u as u8);
                    }
                    Ok(Item::V(Value::Bytes(Rc::new(bytes))))
                }
                _ => Err(self.err(at, "_codecs.encode other than of text as latin1")),
            },
            Global::NdArray => Err(self.err(at, "a call of numpy.ndarray")),
        }
    }

    fn build(&mut self, at: usize, target: Option<Item>, state: Item) -> Result<()> {
        let Some(Item::Obj(id)) = target else {
            return Err(self.err(at, "state set on something that is not an object"));
        };
        let state = self.tuple_items(at, state)?;
        match &self.objs[id] {
            Obj::Dtype { .. } => {
                // (version, byte order, subarray, names, fields, elsize, alignment, flags)
                let order = match state.get(1) {
                    Some(Item::V(Value::Str(o))) if o.len() == 1 => o.chars().next(),
                    _ => return Err(self.err(at, "a dtype state without a byte order")),
                };
                if !matches!(state.get(2), Some(Item::V(Value::None)) | None)
                    || !matches!(state.get(3), Some(Item::V(Value::None)) | None)
                {
                    return Err(self.err(at, "a structured or sub-array dtype"));
                }
                if let Obj::Dtype { order: o, .. } = &mut self.objs[id] {
                    *o = order;
                }
                Ok(())
            }
            Obj::Array(_) => {
                // (version, shape, dtype, is_fortran, data)
                if state.len() != 5 {
                    return Err(self.err(at, "an array state that is not 5 items"));
                }
                let shape = self.shape(at, &state[1])?;
                let descr = self.descr(at, &state[2])?;
                let fortran =
                    matches!(self.value_of(&state[3])?, Value::Bool(true) | Value::Int(1));
                let data = match &state[4] {
                    Item::V(Value::Bytes(b)) => ArrayData::Raw(b.clone()),
                    Item::Obj(l) => match &self.objs[*l] {
                        Obj::List(items) => {
                            let items = items.clone();
                            ArrayData::Objects(
                                items
                                    .iter()
                                    .map(|i| self.resolve(i, 0))
                                    .collect::<Result<_>>()?,
                            )
                        }
                        _ => {
                            return Err(self.err(at, "array data that is neither bytes nor a list"))
                        }
                    },
                    Item::V(Value::Str(s)) => {
                        // Protocol 0/1 style text data is not written by numpy for pickles
                        // upcc reads.
                        let _ = s;
                        return Err(self.err(at, "array data stored as text"));
                    }
                    _ => return Err(self.err(at, "array data that is neither bytes nor a list")),
                };
                self.objs[id] = Obj::Array(Some(Array {
                    descr,
                    shape,
                    fortran,
                    data,
                }));
                Ok(())
            }
            _ => Err(self.err(at, "state set on a list or a dict")),
        }
    }

    /// The sizes of a shape tuple.
    fn shape(&self, at: usize, item: &Item) -> Result<Vec<usize>> {
        match self.value_of(item)? {
            Value::Tuple(t) => t
                .iter()
                .map(|v| match v {
                    Value::Int(n) if *n >= 0 => Ok(*n as usize),
                    _ => Err(self.err(at, "an array shape that is not sizes")),
                })
                .collect(),
            _ => Err(self.err(at, "an array shape that is not a tuple")),
        }
    }

    /// The `.npy`-style descriptor (`<f4`) of a dtype object.
    fn descr(&self, at: usize, item: &Item) -> Result<String> {
        match item {
            Item::Obj(d) => match &self.objs[*d] {
                Obj::Dtype { name, order } => {
                    let order = order.unwrap_or('|');
                    // `=` is the native order: every machine upcc runs on is little-endian.
                    Ok(format!(
                        "{}{}",
                        if order == '=' { '<' } else { order },
                        name
                    ))
                }
                _ => Err(self.err(at, "an array dtype that is not a dtype")),
            },
            _ => Err(self.err(at, "an array dtype that is not a dtype")),
        }
    }

    fn tuple_items(&self, at: usize, item: Item) -> Result<Vec<Item>> {
        match item {
            Item::V(Value::Tuple(t)) => Ok(t.into_iter().map(Item::V).collect()),
            Item::Obj(id) if self.tuples.contains(&id) => match &self.objs[id] {
                Obj::List(items) => Ok(items.clone()),
                _ => unreachable!("tuples are lists"),
            },
            _ => Err(self.err(at, "a state that is not a tuple")),
        }
    }

    fn value_of(&self, item: &Item) -> Result<Value> {
        self.resolve(item, 0)
    }

    /// The finished value of an item (objects as they are now).
    fn resolve(&self, item: &Item, depth: usize) -> Result<Value> {
        if depth > 64 {
            return Err(self.err(self.pos, "objects nested deeper than 64 levels (a cycle?)"));
        }
        self.resolved.set(self.resolved.get() + 1);
        if self.resolved.get() > MAX_VALUES {
            return Err(self.err(
                self.pos,
                format!("more than {MAX_VALUES} values (objects shared over and over)"),
            ));
        }
        Ok(match item {
            Item::V(v) => v.clone(),
            Item::Mark => return Err(self.err(self.pos, "a stray mark")),
            Item::Global(_) => return Err(self.err(self.pos, "a bare global as a value")),
            Item::Obj(id) => match &self.objs[*id] {
                Obj::List(items) => {
                    let vals = items
                        .iter()
                        .map(|i| self.resolve(i, depth + 1))
                        .collect::<Result<Vec<_>>>()?;
                    if self.tuples.contains(id) {
                        Value::Tuple(vals)
                    } else {
                        Value::List(vals)
                    }
                }
                Obj::Dict(pairs) => Value::Dict(
                    pairs
                        .iter()
                        .map(|(k, v)| {
                            Ok((self.resolve(k, depth + 1)?, self.resolve(v, depth + 1)?))
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
                Obj::Array(Some(a)) => Value::Array(a.clone()),
                Obj::Array(None) => {
                    return Err(self.err(self.pos, "a numpy array whose state was never set"))
                }
                Obj::Dtype { .. } => {
                    return Err(self.err(self.pos, "a bare numpy dtype as a value"))
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// `pickle.dumps((X, y), protocol=P)` by numpy 2.4.6 for
    /// X = float32 [[0.5, -1.25, 3.0], [1e-3, 2.5, -0.0]], y = int64 [1, 0].
    const P2: &str = "8002636e756d70792e5f636f72652e6d756c746961727261790a5f7265636f6e7374727563740a7100636e756d70790a6e6461727261790a71014b00857102635f636f646563730a656e636f64650a7103580100000062710458060000006c6174696e317105867106527107877108527109284b014b024b0386710a636e756d70790a64747970650a710b58020000006634710c898887710d52710e284b0358010000003c710f4e4e4e4affffffff4affffffff4b0074711062896803581c0000000000003f0000c2a0c2bf000040406f12c2833a00002040000000c2807111680586711252711374711462680068014b008571156807877116527117284b014b02857118680b580200000069387119898887711a52711b284b03680f4e4e4e4affffffff4affffffff4b0074711c62896803581000000001000000000000000000000000000000711d680586711e52711f747120628671212e";
    const P4: &str = "800495f5000000000000008c166e756d70792e5f636f72652e6d756c74696172726179948c0c5f7265636f6e7374727563749493948c056e756d7079948c076e6461727261799493944b0085944301629487945294284b014b024b03869468038c0564747970659493948c02663494898887945294284b038c013c944e4e4e4affffffff4affffffff4b007494628943180000003f0000a0bf000040406f12833a000020400000008094749462680268054b008594680787945294284b014b028594680c8c02693894898887945294284b0368104e4e4e4affffffff4affffffff4b00749462894310010000000000000000000000000000009474946286942e";
    const P5: &str = "800595db000000000000008c136e756d70792e5f636f72652e6e756d65726963948c0b5f66726f6d627566666572949394289618000000000000000000003f0000a0bf000040406f12833a0000204000000080948c056e756d7079948c0564747970659493948c02663494898887945294284b038c013c944e4e4e4affffffff4affffffff4b007494624b024b0386948c01439474945294680228961000000000000000010000000000000000000000000000009468068c02693894898887945294284b03680a4e4e4e4affffffff4affffffff4b007494624b028594680d7494529486942e";

    fn raw(a: &Array) -> &[u8] {
        match &a.data {
            ArrayData::Raw(b) => b,
            ArrayData::Objects(_) => panic!("numeric"),
        }
    }

    #[test]
    fn numpy_tuples_of_every_protocol_give_the_same_arrays() {
        let x: Vec<u8> = [0.5f32, -1.25, 3.0, 1e-3, 2.5, -0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let y: Vec<u8> = [1i64, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        for (p, hex) in [(2, P2), (4, P4), (5, P5)] {
            let v = read("t.pkl", &unhex(hex)).unwrap_or_else(|e| panic!("protocol {p}: {e}"));
            let Value::Tuple(items) = v else {
                panic!("protocol {p}: a tuple")
            };
            let [Value::Array(a), Value::Array(b)] = items.as_slice() else {
                panic!("protocol {p}: two arrays, got {items:?}")
            };
            assert_eq!(
                (a.descr.as_str(), a.shape.as_slice(), a.fortran),
                ("<f4", &[2usize, 3][..], false),
                "protocol {p}"
            );
            assert_eq!(raw(a), x.as_slice(), "protocol {p}: X bit for bit");
            assert_eq!(
                (b.descr.as_str(), b.shape.as_slice()),
                ("<i8", &[2usize][..]),
                "protocol {p}"
            );
            assert_eq!(raw(b), y.as_slice(), "protocol {p}: y bit for bit");
        }
    }

    #[test]
    fn code_is_never_run_and_anything_else_is_refused_with_the_place() {
        // `os.system('ls')`, the classic malicious pickle.
        let evil = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
        let e = read("evil.pkl", evil).unwrap_err().to_string();
        assert!(e.contains("`os.system`, which upcc does not call"), "{e}");
        assert!(e.contains("evil.pkl") && e.contains("at byte 2"), "{e}");
        // Truncated: the offset and what is missing.
        let p4 = unhex(P4);
        let e = read("t.pkl", &p4[..100]).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        // An opcode outside the subset (INST, protocol 0 objects).
        let e = read("t.pkl", b"\x80\x02(i__main__\nX\n.")
            .unwrap_err()
            .to_string();
        assert!(e.contains("opcode 0x69"), "{e}");
        // Out-of-band buffers.
        let e = read("t.pkl", b"\x80\x05\x97.").unwrap_err().to_string();
        assert!(e.contains("out-of-band"), "{e}");
        // Shared objects nested over and over ("billion laughs"): refused, not expanded.
        let mut bomb = b"\x80\x04]\x94".to_vec(); // an empty list, memo 0
        for k in 0..40u8 {
            bomb.extend_from_slice(&[b'h', k, b'h', k, 0x86, 0x94]); // (m[k], m[k]) → memo k+1
        }
        bomb.push(b'.');
        let e = read("bomb.pkl", &bomb).unwrap_err().to_string();
        assert!(e.contains("values (objects shared over and over)"), "{e}");
        assert!(!is_pickle(b"\x93NUMPY"));
        assert!(is_pickle(&p4));
    }

    #[test]
    fn plain_values_lists_and_dicts_decode() {
        // pickle.dumps({'a': [1, -2, 70000, 2**40], 'b': (1.5, None, True, 'é')}, protocol=P)
        let want = Value::Dict(vec![
            (
                Value::Str("a".into()),
                Value::List(vec![
                    Value::Int(1),
                    Value::Int(-2),
                    Value::Int(70000),
                    Value::Int(1 << 40),
                ]),
            ),
            (
                Value::Str("b".into()),
                Value::Tuple(vec![
                    Value::Float(1.5),
                    Value::None,
                    Value::Bool(true),
                    Value::Str("é".into()),
                ]),
            ),
        ]);
        for hex in [
            "80049538000000000000007d94288c0161945d94284b014afeffffff4a701101008a06000000000001658c01629428473ff80000000000004e888c02c3a9947494752e",
            "80027d71002858010000006171015d7102284b014afeffffff4a701101008a0600000000000165580100000062710328473ff80000000000004e885802000000c3a97104747105752e",
        ] {
            assert_eq!(read("d.pkl", &unhex(hex)).unwrap(), want);
        }
    }
}
