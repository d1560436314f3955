"""The in-house FileCheck (tests/filecheck.py): each directive passes where it should and,
just as important, fails where it should, with a message that points at the check."""

import pytest

import filecheck

OUTPUT = """\
module @m {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  %1 = "stablehlo.collective_permute"(%0) <{handle = 7}> : (tensor<8xi8>) -> tensor<8xi8>
  %2 = stablehlo.add %1, %1 : tensor<4xf32>
  func.func private @second() {
    %3 = stablehlo.while
    %4 = stablehlo.while
  }
}"""


def ok(checks):
  filecheck.check_text(checks, OUTPUT, "t.check")


def fails(checks, *fragments):
  with pytest.raises(filecheck.CheckError) as e:
    filecheck.check_text(checks, OUTPUT, "t.check")
  for fragment in fragments:
    assert fragment in str(e.value), str(e.value)
  return str(e.value)


def test_check_in_order():
  ok("// CHECK: stablehlo.add\n// CHECK: collective_permute\n// CHECK: stablehlo.while")


def test_check_out_of_order_fails():
  fails(
    "// CHECK: stablehlo.while\n// CHECK: collective_permute",
    "t.check:2: CHECK: collective_permute",
    "no match at or after output line 6",
  )


def test_check_missing_text_fails():
  fails("// CHECK: all_reduce", "t.check:1", "no match")


def test_two_checks_cannot_share_one_match():
  ok("// CHECK: %0 = stablehlo.add\n// CHECK: stablehlo.add %1")
  fails("// CHECK: collective_permute\n// CHECK: collective_permute")


def test_next():
  ok(
    "// CHECK: %0 = stablehlo.add\n// CHECK-NEXT: collective_permute\n"
    "// CHECK-NEXT: %2 = stablehlo.add"
  )
  message = fails(
    "// CHECK: %0 = stablehlo.add\n// CHECK-NEXT: %2 = stablehlo.add",
    "CHECK-NEXT: %2 = stablehlo.add",
    "not on the line after",
  )
  assert ">     3 |" in message  # the line where it was expected is marked


def test_same():
  ok("// CHECK: collective_permute\n// CHECK-SAME: handle = 7\n// CHECK-SAME: -> tensor<8xi8>")
  fails("// CHECK: collective_permute\n// CHECK-SAME: tensor<4xf32>", "CHECK-SAME")
  # SAME looks after the match, not before it.
  fails("// CHECK: handle = 7\n// CHECK-SAME: collective_permute", "CHECK-SAME")


def test_not_between_matches():
  ok("// CHECK: %0 = \n// CHECK-NOT: stablehlo.while\n// CHECK: %2 = ")
  fails(
    "// CHECK: %0 = \n// CHECK-NOT: collective_permute\n// CHECK: %2 = ",
    "t.check:2: CHECK-NOT: collective_permute",
    "forbidden text found on output line 3",
  )


def test_not_at_start_and_end():
  ok("// CHECK-NOT: all_reduce\n// CHECK: module")
  fails("// CHECK-NOT: stablehlo.add\n// CHECK: collective_permute", "output line 2")
  ok("// CHECK: while\n// CHECK-NOT: collective_permute")
  fails("// CHECK: collective_permute\n// CHECK-NOT: while", "output line 6")


def test_not_does_not_look_at_the_match_itself():
  ok("// CHECK: stablehlo.add %a\n// CHECK-NOT: add\n// CHECK: stablehlo.add %1")
  ok("// CHECK-NOT: {{^$}}\n// CHECK: stablehlo.while")


def test_count():
  ok("// CHECK-COUNT-2: stablehlo.while")
  fails("// CHECK-COUNT-3: stablehlo.while", "CHECK-COUNT-3")
  # COUNT then NOT: exactly two.
  ok("// CHECK-COUNT-2: stablehlo.add\n// CHECK-NOT: stablehlo.add %")
  fails("// CHECK-COUNT-1: stablehlo.while\n// CHECK-NOT: stablehlo.while", "CHECK-NOT")


def test_label_confines_checks_to_its_section():
  ok(
    "// CHECK-LABEL: module @m\n// CHECK: collective_permute\n"
    "// CHECK-LABEL: @second\n// CHECK-COUNT-2: while"
  )
  # The permute is before the label, so the section after it does not have one.
  fails(
    "// CHECK-LABEL: module @m\n// CHECK-LABEL: @second\n// CHECK: collective_permute", "t.check:3"
  )
  # And a section ends where the next label matched.
  fails(
    "// CHECK-LABEL: module @m\n// CHECK: while\n// CHECK-LABEL: @second", "t.check:2: CHECK: while"
  )
  fails("// CHECK-LABEL: @nothing_like_this", "CHECK-LABEL")


def test_regex_blocks_and_literal_text():
  ok('// CHECK: %{{[0-9]+}} = "stablehlo.collective_permute"({{.*}}) <{handle = {{[1-9]}}}>')
  fails("// CHECK: handle = {{[0-6]}}}>")
  # Outside {{ }} every character is literal.
  fails("// CHECK: stablehlo.ad.")
  ok("// CHECK: (tensor<8xi8>) -> tensor<8xi8>")


def test_blank_runs_match_any_blanks():
  ok("// CHECK: %0   =    stablehlo.add")
  fails("// CHECK: %0=stablehlo.add")
  fails("// CHECK: stable hlo.add")  # a blank in the pattern needs one in the output


def test_variables():
  ok(
    '// CHECK: %[[P:[0-9]+]] = "stablehlo.collective_permute"\n'
    "// CHECK-NEXT: stablehlo.add %[[P]], %[[P]]"
  )
  fails(
    "// CHECK: %[[P:[0-9]+]] = stablehlo.add\n// CHECK: stablehlo.add %[[P]], %[[P]]",
    "stablehlo.add %[[P]]",
  )
  fails("// CHECK: %[[Q]] = ", "uses [[Q]] before any check defines it")


def test_bad_check_files():
  fails("// CHECK-NXT: add", "t.check:1: CHECK-NXT: unknown directive")
  fails("// nothing to check here", "no CHECK directives")
  fails("// CHECK-NEXT: add", "needs an earlier positive match")
  fails("// CHECK:   ", "empty pattern")
  fails("// CHECK: {{[}}", "bad regex")


def test_failure_shows_the_output_near_the_search():
  message = fails("// CHECK: %2 = \n// CHECK: collective_permute")
  assert "%2 = stablehlo.add %1, %1" in message
  assert ">     4 |" in message
