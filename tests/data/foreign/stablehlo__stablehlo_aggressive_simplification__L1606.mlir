//  (a, a1) (b, b1) (c, c1)
//    ▴       ▴       ▴
//    │       │       │
//    ├───────┼──────►│
//    │       │       │
//    │       │       │
//    r0      r1      r2
//    U
//
// Non-conservative case: |{used results}| < |{used operand pairs}|.
//                                  |{r0}| < |{(a, a1), (c, c1)}|
// r1 can be dropped, but partial pruning is not implemented.

// CHECK-LABEL: func.func @reduce_unused_case9
// CHECK-SAME:   ([[ARG0:%.+]]: tensor<8xi64>, [[ARG1:%.+]]: tensor<8xi64>, [[ARG2:%.+]]: tensor<8xi64>)
func.func @reduce_unused_case9(%arg0: tensor<8xi64>,
                               %arg1: tensor<8xi64>,
                               %arg2: tensor<8xi64>) -> tensor<i64> {
  // CHECK: [[R0:%.+]] = stablehlo.constant dense<1>
  // CHECK: [[R1:%.+]] = stablehlo.constant dense<2>
  // CHECK: [[R2:%.+]] = stablehlo.constant dense<3>
  // CHECK: [[R3:%.+]]:3 = stablehlo.reduce([[ARG0]] init: [[R0]]), ([[ARG1]] init: [[R1]]), ([[ARG2]] init: [[R2]])
  %0 = stablehlo.constant dense<1> : tensor<i64>
  %1 = stablehlo.constant dense<2> : tensor<i64>
  %2 = stablehlo.constant dense<3> : tensor<i64>
  %3:3 = stablehlo.reduce(%arg0 init: %0), (%arg1 init: %1), (%arg2 init: %2) across dimensions = [0] :
  (tensor<8xi64>, tensor<8xi64>, tensor<8xi64>, tensor<i64>, tensor<i64>, tensor<i64>) ->
  (tensor<i64>, tensor<i64>, tensor<i64>)
   reducer(%arg3: tensor<i64>, %arg6: tensor<i64>)
          (%arg4: tensor<i64>, %arg7: tensor<i64>)
          (%arg5: tensor<i64>, %arg8: tensor<i64>)
  {
    %4 = stablehlo.add %arg3, %arg5 : tensor<i64>
    %5 = stablehlo.subtract %arg4, %arg7 : tensor<i64>
    %6 = stablehlo.multiply %arg5, %arg8 : tensor<i64>
    stablehlo.return %4, %5, %6 : tensor<i64>, tensor<i64>, tensor<i64>
  }
  return %3#0 : tensor<i64>
}
