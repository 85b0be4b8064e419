"""Realistic snippets of every tree-sitter language the chunker knows, checked chunk by chunk."""

from __future__ import annotations

import pytest
from test_chunking import assert_invariants as base_invariants

from codesearch.indexing.chunking import CHUNKED_LANGUAGES, chunk_source

# fmt: off
SNIPPETS = {
"python": '''import os
from typing import Any

TIMEOUT = 30


class HttpClient(BaseClient):
    """A tiny client."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    @retry(times=3)
    def get(self, path: str) -> Any:
        # join and fetch
        return self._fetch(self.base_url + path)


async def fetch_all(urls):
    return [await HttpClient(u).get("/") for u in urls]
''',
"javascript": '''import fs from "fs";

const LIMIT = 10;

// Parse a config file.
function parseConfig(path) {
  return JSON.parse(fs.readFileSync(path, "utf8"));
}

export class Cache {
  constructor(size) {
    this.size = size;
  }

  get(key) {
    return this.map.get(key);
  }
}

const double = (x) => x * 2;

export default function main() {
  console.log(parseConfig("a.json"));
}
''',
"typescript": '''import { Request } from "./http";

export interface Handler {
  handle(req: Request): Promise<void>;
}

type Id = string | number;

enum Color { Red, Green }

export class Router implements Handler {
  private routes: Map<string, Handler> = new Map();

  async handle(req: Request): Promise<void> {
    const h = this.routes.get(req.path);
    await h?.handle(req);
  }
}

export function makeRouter(): Router {
  return new Router();
}

namespace Util {
  export const x = 1;
}
''',
"tsx": '''import React from "react";

interface Props { name: string }

export function Greeting({ name }: Props) {
  return <div className="greeting">Hello {name}</div>;
}

export const Button = (props: { label: string }) => {
  return <button>{props.label}</button>;
};

class Panel extends React.Component<Props> {
  render() {
    return <section>{this.props.name}</section>;
  }
}
''',
"go": '''package server

import (
	"fmt"
	"net/http"
)

const maxConns = 100

// Server serves requests.
type Server struct {
	addr string
}

type Handler interface {
	Serve(w http.ResponseWriter, r *http.Request)
}

// NewServer builds a server.
func NewServer(addr string) *Server {
	return &Server{addr: addr}
}

func (s *Server) Start() error {
	fmt.Println("listening on", s.addr)
	return http.ListenAndServe(s.addr, nil)
}
''',
"rust": '''use std::collections::HashMap;

const MAX: usize = 10;

/// A key-value store.
#[derive(Debug, Default)]
pub struct Store {
    map: HashMap<String, String>,
}

pub enum Command {
    Get(String),
    Set(String, String),
}

pub trait Backend {
    fn load(&self) -> Vec<u8>;
}

impl Store {
    pub fn new() -> Self {
        Store { map: HashMap::new() }
    }

    pub fn get(&self, key: &str) -> Option<&String> {
        self.map.get(key)
    }
}

mod tests {
    fn helper() {}
}

fn main() {
    let s = Store::new();
    println!("{:?}", s);
}
''',
"java": '''package com.example;

import java.util.List;

/** A repository of users. */
public class UserRepository {
    private final List<String> users;

    public UserRepository(List<String> users) {
        this.users = users;
    }

    @Override
    public String toString() {
        return "UserRepository" + users;
    }
}

interface Finder {
    String find(int id);
}

enum Role { ADMIN, USER }
''',
"kotlin": '''package com.example

import kotlin.math.max

data class Point(val x: Int, val y: Int)

interface Shape {
    fun area(): Double
}

class Circle(val r: Double) : Shape {
    override fun area(): Double {
        return 3.14 * r * r
    }
}

object Registry {
    fun register(name: String) {
        println(name)
    }
}

fun distance(a: Point, b: Point): Int {
    return max(a.x - b.x, a.y - b.y)
}
''',
"scala": '''package example

import scala.collection.mutable

trait Greeter {
  def greet(name: String): String
}

class Polite extends Greeter {
  def greet(name: String): String = s"Hello, $name"
}

object Main {
  def main(args: Array[String]): Unit = {
    println(new Polite().greet("world"))
  }
}

case class User(name: String, age: Int)
''',
"swift": '''import Foundation

protocol Drawable {
    func draw() -> String
}

struct Point {
    var x: Double
    var y: Double
}

class Canvas: Drawable {
    var items: [String] = []

    func draw() -> String {
        return items.joined(separator: ",")
    }
}

enum Direction {
    case north, south
}

func distance(_ a: Point, _ b: Point) -> Double {
    return sqrt(pow(a.x - b.x, 2) + pow(a.y - b.y, 2))
}
''',
"c": '''#include <stdio.h>
#include <stdlib.h>

#define MAX 10

struct node {
    int value;
    struct node *next;
};

typedef enum { RED, GREEN } color;

/* Push a value. */
static struct node *push(struct node *head, int value) {
    struct node *n = malloc(sizeof *n);
    n->value = value;
    n->next = head;
    return n;
}

int main(void) {
    struct node *list = push(NULL, 1);
    printf("%d\\n", list->value);
    return 0;
}
''',
"cpp": '''#include <string>
#include <vector>

namespace geo {

class Shape {
 public:
  virtual ~Shape() = default;
  virtual double area() const = 0;
};

struct Rect : Shape {
  double w, h;
  double area() const override { return w * h; }
};

template <typename T>
T clamp(T v, T lo, T hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace geo

double geo_total(const std::vector<geo::Shape*>& shapes) {
  double t = 0;
  for (auto* s : shapes) t += s->area();
  return t;
}
''',
"csharp": '''using System;
using System.Collections.Generic;

namespace Shop
{
    public interface IRepository
    {
        void Save(Order order);
    }

    public class Order
    {
        public int Id { get; set; }

        public decimal Total()
        {
            return 0m;
        }
    }

    public enum Status { Open, Closed }

    public struct Money
    {
        public decimal Amount;
    }
}
''',
"php": '''<?php

namespace App\\Models;

use Illuminate\\Support\\Str;

interface HasName
{
    public function name(): string;
}

class User implements HasName
{
    private string $first;

    public function __construct(string $first)
    {
        $this->first = $first;
    }

    public function name(): string
    {
        return Str::title($this->first);
    }
}

function helper(array $xs): int
{
    return count($xs);
}
''',
"ruby": '''require "json"

module Billing
  class Invoice
    attr_reader :total

    def initialize(total)
      @total = total
    end

    def self.parse(text)
      new(JSON.parse(text)["total"])
    end
  end
end

def format_money(cents)
  format("%.2f", cents / 100.0)
end
''',
"elixir": '''defmodule Math do
  @moduledoc "Math helpers."

  def sum(a, b) do
    a + b
  end

  defp helper(x), do: x * 2

  defmacro twice(expr) do
    quote do
      unquote(expr)
      unquote(expr)
    end
  end
end

defprotocol Size do
  def size(data)
end
''',
"haskell": '''module Main where

import Data.List (sortBy)

data Shape = Circle Double | Square Double

class Describable a where
  describe :: a -> String

area :: Shape -> Double
area (Circle r) = pi * r * r
area (Square s) = s * s

main :: IO ()
main = do
  print (area (Circle 1.0))
  putStrLn "done"
''',
"lua": '''local M = {}

local function clamp(x, lo, hi)
  if x < lo then return lo end
  if x > hi then return hi end
  return x
end

function M.greet(name)
  return "hello " .. name
end

function M:method()
  return self
end

return M
''',
"zig": '''const std = @import("std");

const Point = struct {
    x: i32,
    y: i32,

    pub fn add(self: Point, other: Point) Point {
        return .{ .x = self.x + other.x, .y = self.y + other.y };
    }
};

pub fn main() !void {
    const p = Point{ .x = 1, .y = 2 };
    std.debug.print("{}\\n", .{p.add(p)});
}

test "add" {
    try std.testing.expect(true);
}
''',
"bash": '''#!/usr/bin/env bash
set -euo pipefail

LOG=/tmp/build.log

# Print a message.
log() {
  echo "$(date) $*" >> "$LOG"
}

function build {
  log "building"
  make -j4
}

build "$@"
''',
}
# fmt: on

# At a 48-token budget every definition of these snippets that is small enough stands alone
# (or merges with its small neighbours): (kind, symbol, first line, last line) that must be
# among the chunks. Leading comments, doc comments, attributes and decorators belong to the
# definition that follows them.
EXPECTED = {
    "python": [("method", "__init__", 10, 11), ("function", "fetch_all", 19, 20)],
    "javascript": [("function", "parseConfig", 5, 8), ("class", "Cache", 10, 18)],
    "typescript": [("interface", "Handler", 1, 5), ("method", "handle", 14, 14)],
    "tsx": [("function", "Greeting", 5, 7), ("function", "Button", 9, 11),
            ("class", "Panel", 13, 17)],
    "go": [("struct", "Server", 10, 13), ("function", "NewServer", 19, 22),
           ("method", "Start", 24, 27)],
    "rust": [("struct", "Store", 5, 9), ("method", "get", 25, 28)],
    "java": [("method", "UserRepository", 9, 11), ("method", "toString", 13, 17)],
    "kotlin": [("interface", "Shape", 7, 9), ("class", "Circle", 11, 15),
               ("object", "Registry", 17, 21), ("function", "distance", 23, 25)],
    "scala": [("class", "Polite", 9, 11), ("object", "Main", 13, 17), ("class", "User", 19, 19)],
    "swift": [("method", "draw", 15, 18), ("enum", "Direction", 20, 22),
              ("function", "distance", 24, 26)],
    "c": [("struct", "node", 1, 9), ("function", "main", 21, 25)],
    "cpp": [("struct", "Rect", 12, 15), ("function", "geo_total", 24, 28)],
    "csharp": [("class", "Order", 11, 13), ("method", "Total", 15, 19),
               ("struct", "Money", 23, 27)],
    "php": [("method", "__construct", 16, 19), ("method", "name", 21, 25),
            ("function", "helper", 27, 30)],
    "ruby": [("method", "parse", 11, 15), ("function", "format_money", 17, 19)],
    "elixir": [("macro", "twice", 10, 16), ("protocol", "Size", 18, 20)],
    "haskell": [("function", "area", 10, 12), ("function", "main", 14, 17)],
    "lua": [("function", "clamp", 1, 7)],
    "zig": [("function", "main", 12, 15), ("test", "add", 17, 19)],
    "bash": [("function", "build", 11, 16)],
}
# Every definition name the 48-token chunks mention (merged groups list theirs).
SYMBOLS = {
    "python": ["HttpClient", "__init__", "get", "fetch_all"],
    "javascript": ["parseConfig", "Cache", "double", "main"],
    "typescript": ["Handler", "Id", "Color", "Router", "handle", "makeRouter", "Util"],
    "tsx": ["Props", "Greeting", "Button", "Panel"],
    "go": ["Server", "Handler", "NewServer", "Start"],
    "rust": ["Store", "Command", "Backend", "new", "get", "tests", "main"],
    "java": ["UserRepository", "toString", "Finder", "Role"],
    "kotlin": ["Point", "Shape", "Circle", "Registry", "distance"],
    "scala": ["Greeter", "Polite", "Main", "User"],
    "swift": ["Drawable", "Point", "Canvas", "draw", "Direction", "distance"],
    "c": ["node", "color", "push", "main"],
    "cpp": ["geo", "Shape", "Rect", "clamp", "geo_total"],
    "csharp": ["Shop", "IRepository", "Order", "Total", "Status", "Money"],
    "php": ["App\\Models", "HasName", "User", "__construct", "name", "helper"],
    "ruby": ["Billing", "Invoice", "initialize", "parse", "format_money"],
    "elixir": ["Math", "sum", "helper", "twice", "Size"],
    "haskell": ["Shape", "Describable", "area", "main"],
    "lua": ["clamp", "M.greet", "M:method"],
    "zig": ["Point", "add", "main"],
    "bash": ["log", "build"],
}


def assert_invariants(src: str, chunks) -> None:
    """The chunker's invariants (test_chunking), plus: no chunk starts or ends on a blank
    line, and the encoder text is the header over the code."""
    base_invariants(src, chunks)
    for c in chunks:
        assert c.text.split("\n")[0].strip() and c.text.split("\n")[-1].strip()
        assert c.encoder_text == c.header + "\n" + c.text


def test_every_language_has_a_snippet():
    assert set(SNIPPETS) == CHUNKED_LANGUAGES - {"markdown", "starlark", "cython"}


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_definitions_found_with_exact_lines(language):
    src = SNIPPETS[language]
    chunks = chunk_source(f"x.{language}", src, language, max_tokens=48)
    assert_invariants(src, chunks)
    got = {(c.kind, c.symbol, c.start_line, c.end_line) for c in chunks}
    for expected in EXPECTED[language]:
        assert expected in got, (expected, sorted(got, key=lambda g: g[2]))
    names = [n for c in chunks if c.symbol for n in c.symbol.split(", ")]
    assert set(SYMBOLS[language]) <= set(names)
    assert all(c.language == language for c in chunks)


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_whole_snippet_fits_one_chunk_at_model_budget(language):
    src = SNIPPETS[language]
    chunks = chunk_source("a", src, language, max_tokens=2048)
    assert len(chunks) == 1
    assert_invariants(src, chunks)


@pytest.mark.parametrize("budget", [16, 24, 40, 64, 128, 512])
@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_no_line_lost_at_any_budget(language, budget):
    src = SNIPPETS[language]
    assert_invariants(src, chunk_source("a", src, language, max_tokens=budget))


def test_scope_and_header_of_a_method():
    chunks = chunk_source("src/http/client.py", SNIPPETS["python"], "python", max_tokens=48)
    init = next(c for c in chunks if c.symbol == "__init__")
    assert init.scope == "class HttpClient(BaseClient):"
    assert init.header == "src/http/client.py > class HttpClient(BaseClient):"
    assert init.encoder_text.startswith("src/http/client.py > class HttpClient(BaseClient):\n")
    rust = chunk_source("src/store.rs", SNIPPETS["rust"], "rust", max_tokens=48)
    get = next(c for c in rust if c.symbol == "get")
    assert (get.kind, get.scope) == ("method", "impl Store")
